"""What the node keeps: how long what left ``spec.models`` stays, and what goes first when the volume fills.

``Retention`` follows what holds a digest on the node: its ``spec.models`` item (referenced, or
unreferenced with a ``collectTime``; pinned or not, see ``lifecycle``) and the Pods that mounted it (a
mounted digest counts as referenced: never removed nor evicted). A digest that leaves ``spec.models`` is
noted (``absentSince``, persisted: a restart neither resets nor skips its delay): its published tree is
removed ``removal_delay`` seconds later, its partial work and failure record ``partial_retention``
seconds later, unless it comes back first. Nothing is collected before the spec is known.

``Capacity`` counts the bytes the cache stores (a file several trees share counted once, partial work, and
what running downloads wrote) against the volume's watermarks. While the volume is above the high
watermark, and before a download is refused for lack of room, Ready trees neither pinned nor referenced
and partial work out of ``spec.models`` are evicted, least recently used first (never used: first), down to
the low watermark (or until the download fits). A referenced or pinned tree and a running download are
never evicted.

Neither takes a lock: the engine calls them with its lock held. Both read the running downloads by
digest through ``running()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.lifecycle import Wanted
from gpustack_models.plugin.engine.records import READY, Item, Records, rfc3339

log = logging.getLogger(__name__)


class Written(Protocol):
    """What capacity reads of a running download (``download.Download``)."""

    @property
    def size(self) -> int: ...

    @property
    def remaining_bytes(self) -> int: ...

    @property
    def linked_bytes(self) -> int: ...


Running = Callable[[], Mapping[str, Written]]  # the running downloads by digest


def check_watermarks(high: float, low: float) -> None:
    if not (0 < low <= high <= 100):
        raise ValueError("watermarks must satisfy 0 < low <= high <= 100")


def parse_wanted(items: Iterable[Wanted | dict]) -> dict[str, Wanted]:
    """``spec.models`` (``Wanted`` or spec items) by digest; items without a digest left out."""
    wanted: dict[str, Wanted] = {}
    for raw in items:
        item = raw if isinstance(raw, Wanted) else Wanted.from_spec(raw)
        if item is not None:
            wanted[item.digest] = item
    return wanted


class Retention:
    """What ``spec.models`` and the mounts hold, when the rest goes, and in which order (see the module)."""

    def __init__(self, records: Records, running: Running, *, removal_delay: float, partial_retention: float):
        self.records = records
        self.running = running
        self.wanted: dict[str, Wanted] | None = None  # spec.models by digest; None until the spec is known
        self.mounted: frozenset[str] = frozenset()  # digests a Pod has mounted: never removed nor evicted
        self.removal_delay = float(removal_delay)
        self.partial_retention = float(partial_retention)

    def referenced(self, digest: str) -> bool:
        """True unless the spec is known and does not reference ``digest`` (a mounted digest is referenced)."""
        if self.wanted is None or digest in self.mounted:
            return True
        wanted = self.wanted.get(digest)
        return wanted is not None and wanted.referenced

    def wanted_of(self, digest: str) -> Wanted | None:
        """The ``spec.models`` item of ``digest``, if the spec is known and has one."""
        return self.wanted.get(digest) if self.wanted is not None else None

    def set_wanted(self, items: Iterable[Wanted | dict], now: float) -> None:
        """The store's ``spec.models``; notes which digests left it or came back at ``now``."""
        self.wanted = parse_wanted(items)
        self.note_absence(now)

    def note_absence(self, now: float) -> None:
        """Note when each digest left ``spec.models`` or came back, and the collectTime its item announced
        (persisted)."""
        for digest, item in self.records.items.items():
            wanted = self.wanted.get(digest)
            if wanted is not None:
                absent_since, collect_time = None, wanted.collect_time
            elif item.absent_since is None or item.absent_since > now:
                absent_since, collect_time = now, item.collect_time
            else:
                continue
            if (item.absent_since, item.collect_time) != (absent_since, collect_time):
                item.absent_since, item.collect_time = absent_since, collect_time
                self.records.persist(item)

    def set_mounted(self, digests: Iterable[str], now: float) -> None:
        """The digests mounted now; one no longer mounted and out of ``spec.models`` is absent from ``now``."""
        mounted = frozenset(digests)
        released = self.mounted - mounted
        self.mounted = mounted
        for digest in released:
            item = self.records.get(digest)
            if item is not None and item.absent_since is not None:
                item.absent_since = now
                self.records.persist(item)

    def touch_mounted(self, now: float, interval: float) -> list[str]:
        """Note the use of every mounted Ready tree last used ``interval`` seconds ago or more (saved);
        the digests touched."""
        touched = []
        for digest in sorted(self.mounted):
            item = self.records.get(digest)
            if item is None or item.state != READY:
                continue
            if item.last_used is None or now - item.last_used >= interval:
                self.records.touch(item, now, persist=True)
                touched.append(digest)
        return touched

    def removal_time(self, item: Item) -> float | None:
        """When ``item`` is removed unless referenced again (``None``: referenced, mounted, or the spec not
        known yet). The delay (``removal_delay`` for a published tree, ``partial_retention`` for partial
        work) runs from the ``collectTime`` its ``spec.models`` item announced, or, for a digest that left
        with none, from when it left: so the time the status shows is known, and kept, from the moment the
        grace begins."""
        if self.wanted is None or item.digest in self.mounted:
            return None
        wanted = self.wanted.get(item.digest)
        if wanted is not None and wanted.collect_time is None:
            return None
        published = item.state == READY and item.digest not in self.running()
        delay = self.removal_delay if published else self.partial_retention
        if wanted is not None:  # unreferenced, in its grace
            return wanted.collect_time + delay
        if item.absent_since is None:
            return None
        if item.collect_time is not None:  # left after its grace: the time announced holds
            return max(item.collect_time + delay, item.absent_since)
        return item.absent_since + delay

    def due(self, now: float) -> list[Item]:
        """The items out of ``spec.models`` whose removal time has come (none runs)."""
        running = self.running()
        out = []
        for digest, item in self.records.items.items():
            removal = self.removal_time(item)
            if removal is not None and now >= removal and digest not in running and digest not in self.wanted:
                out.append(item)
        return out

    def evictable(self) -> list[Item]:
        """What disk pressure may take, least recently used first (never used: first; then by digest):
        Ready trees neither pinned nor referenced, and partial work out of ``spec.models``; never a
        running download. Nothing before the spec is known."""
        if self.wanted is None:
            return []
        running = self.running()
        out = []
        for digest, item in self.records.items.items():
            wanted = self.wanted.get(digest)
            if digest in running or digest in self.mounted:
                continue
            if wanted is not None and (wanted.referenced or wanted.pinned):
                continue
            if item.state == READY or (wanted is None and self.records.idle_partial.get(digest)):
                out.append(item)
        return sorted(out, key=lambda i: (i.last_used if i.last_used is not None else float("-inf"), i.digest))


class Capacity:
    """The cache's bytes against the volume's watermarks, and the removals that keep them (see the module).

    ``high_percent`` / ``low_percent``: the volume's watermarks."""

    def __init__(
        self, cache: Cache, retention: Retention, running: Running, *, high_percent: float, low_percent: float
    ):
        check_watermarks(float(high_percent), float(low_percent))
        self.cache = cache
        self.retention = retention
        self.records = retention.records
        self.running = running
        self.high, self.low = float(high_percent), float(low_percent)
        self.low_on_room = False  # from reaching the high watermark until back at the low one

    def set_watermarks(self, high: float, low: float) -> None:
        check_watermarks(float(high), float(low))
        self.high, self.low = float(high), float(low)

    # ---------------------------------------------------------------- bytes

    def stored_bytes(self) -> int:
        """The published trees (an inode several trees share counted once), partial work, and what the
        running downloads wrote (not what they linked from the trees)."""
        stored = self.cache.shared.stored_bytes()
        stored += sum(self.records.idle_partial.values())
        stored += sum(d.size - d.remaining_bytes - d.linked_bytes for d in self.running().values())
        return stored

    def report(self, stored: int) -> dict:
        """``totalBytes`` of the volume, ``storedBytes`` of the cache, ``usedPercent`` of the volume;
        notes whether room is low (see ``low_on_room``)."""
        total, used = self.cache.volume(stored)
        percent = round(100.0 * used / total) if total else 100
        if percent >= self.high:
            self.low_on_room = True
        elif percent <= self.low:
            self.low_on_room = False
        return {"totalBytes": total, "storedBytes": stored, "usedPercent": percent}

    def used_percent(self) -> int:
        total, used = self.cache.volume(self.stored_bytes())
        return round(100.0 * used / total) if total else 100

    def held_bytes(self, item: Item) -> int:
        """Bytes removing ``item`` gives back when nothing runs for it (of a tree: the files no other
        tree shares)."""
        if item.state == READY:
            return self.cache.shared.exclusive_bytes(item.digest)
        return self.records.idle_partial.get(item.digest, 0)

    def freeable(self, items: list[Item]) -> int:
        """Bytes removing all of ``items`` gives back (files they alone share counted once)."""
        trees = [item.digest for item in items if item.state == READY]
        return self.cache.shared.freed_bytes(trees) + sum(
            self.records.idle_partial.get(item.digest, 0) for item in items if item.state != READY
        )

    # ---------------------------------------------------------------- removals

    def collect(self, now: float) -> list[str]:
        """Remove what stayed out of ``spec.models`` past its delay, then relieve the pressure; nothing
        before the spec is known. The digests removed."""
        if self.retention.wanted is None:
            return []
        self.retention.note_absence(now)
        removed = []
        for item in self.retention.due(now):
            why = "out of spec.models" if item.state == READY else "partial work out of spec.models"
            self._remove(item, f"{why} for {now - item.absent_since:.0f}s")
            removed.append(item.digest)
        return removed + self.relieve_pressure()

    def relieve_pressure(self) -> list[str]:
        """Above the high watermark, evict down to the low one; the digests evicted."""
        percent = self.used_percent()
        if percent <= self.high:
            return []
        evicted = []
        for item in self.retention.evictable():
            if percent <= self.low:
                break
            self._evict(item, f"the volume is at {percent}% (high {self.high:g}%, low {self.low:g}%)")
            evicted.append(item.digest)
            percent = self.used_percent()
        return evicted

    def make_room(self, excess: float, why: str) -> list[str]:
        """Evict, least recently used first, until ``excess`` bytes are freed; nothing if everything
        that may be evicted would not free that much. The digests evicted."""
        if excess <= 0:
            return []
        candidates = self.retention.evictable()
        if self.freeable(candidates) < excess:
            return []
        evicted = []
        for item in candidates:
            if excess <= 0:
                break
            excess -= self.held_bytes(item)
            reason = f"{why} (volume at {self.used_percent()}%, high {self.high:g}%, low {self.low:g}%)"
            self._evict(item, reason)
            evicted.append(item.digest)
        return evicted

    def reserve(self, digest: str, remaining: int, others: int) -> tuple[list[str], str | None]:
        """Whether the download of ``digest``, with ``remaining`` bytes still to write, fits under the high
        watermark beside the ``others`` bytes the other running downloads reserved; what may be evicted
        goes when that makes it fit. The digests evicted, and why it does not fit (``None`` if it does)."""
        total, used = self.cache.volume(self.stored_bytes())
        limit = total * self.high / 100.0
        evicted = self.make_room(used + others + remaining - limit, f"to make room for {digest[:19]}")
        if evicted:
            total, used = self.cache.volume(self.stored_bytes())
        if used + others + remaining <= limit:
            return evicted, None
        return evicted, (
            f"needs {remaining} more bytes, {max(0, int(limit - used - others))} bytes are free under the"
            f" volume's {self.high:g}% watermark ({used} of {total} bytes used, {others} reserved by other"
            " downloads)"
        )

    def _remove(self, item: Item, why: str) -> None:
        log.info("removed %s (%d bytes): %s", item.digest, self.held_bytes(item), why)
        self.records.remove(item.digest)

    def _evict(self, item: Item, why: str) -> None:
        log.info(
            "evicted %s (%d bytes, last used %s): %s",
            item.digest,
            self.held_bytes(item),
            rfc3339(item.last_used) or "never",
            why,
        )
        self.records.remove(item.digest)
