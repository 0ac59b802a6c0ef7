"""The mirror's lag, from an event's arrival at the informer to the commit of its row.

With ``GPUSTACK_MIRROR_LAG_FILE`` set, the mirror tasks append one JSON line per event entry they applied
(or found already superseded by a newer row): ``{"r": resource, "k": "namespace/name", "rv": its
resourceVersion, "n": how many watch events it stands for, "a": arrival, "c": commit}`` with both times
as wall-clock seconds. ``n`` is more than 1 when the informer coalesced several events of the object;
``a`` is then the arrival of the first of them, so the lag of each is at most ``c - a``. The lines of one
task are written with one ``write`` on a file opened for appending, so the Celery worker's processes never
interleave them. Across machines the two clocks differ by their skew.
"""

from __future__ import annotations

import logging
import os

import orjson
from django.conf import settings

log = logging.getLogger(__name__)


def line(resource: str, obj: dict, events: int, arrived: float, committed: float) -> bytes:
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
    rv = meta.get("resourceVersion") or ""
    return orjson.dumps({"r": resource, "k": key, "rv": rv, "n": events, "a": arrived, "c": committed}) + b"\n"


def record(lines: list[bytes]) -> None:
    """Append ``lines`` to the lag file, if one is set (a failure is logged, never raised)."""
    path = settings.MIRROR_LAG_FILE
    if not path or not lines:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"".join(lines))
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("could not append to GPUSTACK_MIRROR_LAG_FILE %s: %s", path, exc)
