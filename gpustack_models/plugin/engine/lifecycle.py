"""What the node's store asks of each digest (a ``spec.models`` item), as the engine needs it.

An item without ``collectTime`` is *referenced*: something wants the digest on this node, so it is
downloaded and never evicted. An item with ``collectTime`` is *unreferenced*: a tree already there stays
(it may be evicted under disk pressure), nothing is downloaded for it, and the service drops it from
``spec.models`` at that time. ``pinned`` keeps a referenced tree regardless of disk pressure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


def parse_rfc3339(text) -> float | None:
    """Epoch seconds of an RFC 3339 time (``...Z`` or with an offset), ``None`` if it is not one."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


@dataclass(frozen=True)
class Wanted:
    """One ``spec.models`` item."""

    digest: str
    pinned: bool = False
    referenced: bool = True
    collect_time: float | None = None  # epoch seconds; only while unreferenced

    @classmethod
    def from_spec(cls, item: dict) -> Wanted | None:
        """The item of a store's spec, ``None`` without a digest."""
        digest = item.get("digest") if isinstance(item, dict) else None
        if not isinstance(digest, str) or not digest:
            return None
        collect = item.get("collectTime")
        return cls(
            digest=digest,
            pinned=item.get("pinned") is True,
            referenced=collect is None,
            collect_time=parse_rfc3339(collect),
        )
