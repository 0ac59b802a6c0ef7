"""How values print in tables: sizes like ``135.4Gi`` and ages exactly as kubectl prints them."""

from __future__ import annotations

from datetime import UTC, datetime

_UNITS = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def human_bytes(value) -> str:
    """Binary-suffixed size with one decimal (``953.3Mi``); bytes below 1 KiB print bare."""
    if value is None or value == "":
        return ""
    size = float(value)
    if size < 1024:
        return str(int(size))
    unit = ""
    for unit in _UNITS:
        size /= 1024.0
        if size < 1024 or unit == _UNITS[-1]:
            break
    return f"{size:.1f}{unit}"


def human_duration(seconds: float) -> str:
    """A port of k8s.io/apimachinery/pkg/util/duration.HumanDuration, which kubectl's AGE uses."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 60 * 2:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def age(timestamp: str | None, now: datetime | None = None) -> str:
    created = parse_time(timestamp)
    if created is None:
        return "<unknown>"
    now = now or datetime.now(UTC)
    return human_duration((now - created).total_seconds())
