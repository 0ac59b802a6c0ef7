"""How values print in tables, the console and messages: sizes like ``135.4Gi``, ages exactly as kubectl
prints them, times as RFC 3339 UTC to the second, and a node store's capacity as one figure.

One formatter per kind of value, free of Django, so the API's tables, the console's pages and the node
plugin's messages (which import no Django) print the same value the same way."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_UNITS = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def human_bytes(value) -> str:
    """Binary-suffixed size with one decimal (``953.3Mi``); bytes below 1 KiB with ``B`` (``961B``), so no size
    reads as a bare count next to the others. The one size formatter of tables, the console and messages."""
    if value is None or value == "":
        return ""
    size = float(value)
    if size < 1024:
        return f"{int(size)}B"
    unit = ""
    for unit in _UNITS:
        size /= 1024.0
        if size < 1024 or unit == _UNITS[-1]:
            break
    return f"{size:.1f}{unit}"


def _pair(major: int, major_unit: str, minor: int, minor_unit: str) -> str:
    return f"{major}{major_unit}" if minor == 0 else f"{major}{major_unit}{minor}{minor_unit}"


def human_duration(seconds: float) -> str:
    """A port of k8s.io/apimachinery/pkg/util/duration.HumanDuration, which kubectl's AGE uses."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 60 * 2:
        return f"{s}s"
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if hours < 48:
        return _minutes_and_hours(s, minutes, hours)
    if hours < 24 * 8:
        return _pair(days, "d", hours % 24, "h")
    if hours < 24 * 365 * 2:
        return f"{days}d"
    if hours < 24 * 365 * 8:
        return _pair(days // 365, "y", days % 365, "d")
    return f"{days // 365}y"


def _minutes_and_hours(s: int, minutes: int, hours: int) -> str:
    if minutes < 10:
        return _pair(minutes, "m", s % 60, "s")
    if minutes < 60 * 3:
        return f"{minutes}m"
    if hours < 8:
        return _pair(hours, "h", minutes % 60, "m")
    return f"{hours}h"


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _as_time(value) -> datetime | None:
    """A datetime from a datetime (naive ones are UTC, as the service stores them) or an RFC 3339 string."""
    if isinstance(value, str):
        try:
            value = parse_time(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def timestamp(value, now: datetime | None = None, age: bool = False) -> str:
    """``2026-12-04T21:48:50Z``: RFC 3339 in UTC to the second, as Kubernetes writes times; with ``age``,
    how long ago (``(5m ago)``) or how far ahead (``(in 59m)``) as kubectl's AGE prints it. The one time
    formatter of the console; empty for no time."""
    when = _as_time(value)
    if when is None:
        return ""
    when = when.replace(microsecond=0)  # the age of the time shown
    text = when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if not age:
        return text
    seconds = ((now or datetime.now(UTC)) - when).total_seconds()
    relative = f"{human_duration(seconds)} ago" if seconds >= 0 else f"in {human_duration(-seconds)}"
    return f"{text} ({relative})"


def capacity_text(total_bytes: int, stored_bytes: int, used_percent: int) -> str:
    """A node store's capacity as one figure, from its status: ``8% of 252.0Gi used (the model cache holds
    24.0Mi)``. ``used_percent`` and ``total_bytes`` are the volume's (whatever else shares it), which the
    watermarks and ``CapacityLow`` use; ``stored_bytes`` are the model cache's own bytes on it."""
    if not total_bytes:
        return "no capacity reported yet"
    return f"{volume_used(total_bytes, used_percent)} used (the model cache holds {human_bytes(stored_bytes)})"


def volume_used(total_bytes: int, used_percent: int) -> str:
    """The volume's part of the capacity figure, ``8% of 252.0Gi`` (``kubectl get nms``'s VOLUME column)."""
    return f"{used_percent or 0}% of {human_bytes(total_bytes)}" if total_bytes else ""


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: str | None) -> float | None:
    """Seconds of a Go duration (``24h``, ``1h30m``, ``90s``), as the schema admits them; None if absent
    or malformed."""
    if not value:
        return None
    parts = _DURATION_PART.findall(value)
    if "".join(n + u for n, u in parts) != value:
        return None
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
