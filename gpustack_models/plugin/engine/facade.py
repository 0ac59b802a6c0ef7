"""The node's download engine: what the plugin's Kubernetes glue talks to.

One ``Engine`` per node holds the cache and runs at most one ``Download`` per digest, all sharing
the node-wide limits. The glue:

- passes the store's ``spec.models`` items to ``set_wanted`` whenever the spec changes (which digests
  are referenced, unreferenced with a ``collectTime``, or pinned; see ``lifecycle``);
- calls ``ensure(ticket)`` for every referenced digest that is not ``Ready`` (the engine keeps a
  running download, refuses to start one before its ``retryTime`` unless forced, answers ``Ready``
  for a published tree without any request, and starts nothing for a digest not referenced);
- writes ``entries()`` / ``capacity()`` to the store's status (``Entry.status()`` is the status
  item), at once when ``on_change`` fires and on its progress thresholds otherwise;
- serves ``running()`` as the live-bytes endpoint;
- calls ``collect()`` periodically (removal of what left ``spec.models``, and eviction while the
  volume is above its high watermark), ``set_limits`` / ``set_watermarks`` when the store's spec
  changes, and ``close()`` at shutdown (running downloads stay resumable).

``Engine`` puts together the parts, each in its module: ``records`` (what is known of each digest, kept
on disk: everything the engine knows survives a restart), ``capacity`` (``Retention``: how long what
left ``spec.models`` stays; ``Capacity``: the watermarks and eviction) and ``jobs`` (the downloads).
They share the engine's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.capacity import Capacity, Retention
from gpustack_models.plugin.engine.download import Download, DownloadSettings, Limits
from gpustack_models.plugin.engine.failures import BACKOFF_INITIAL_SECONDS, SourcePenalties
from gpustack_models.plugin.engine.jobs import Jobs
from gpustack_models.plugin.engine.lifecycle import Wanted
from gpustack_models.plugin.engine.peering import FanOutFactory
from gpustack_models.plugin.engine.records import READY, Entry, Item, Records, entry_of
from gpustack_models.plugin.engine.ticket import FetchTicket

log = logging.getLogger(__name__)


class Engine:
    """The node's cache and downloads. Thread-safe; every method returns quickly.

    ``root``: the cache directory. ``concurrency`` / ``bytes_per_second``: the node-wide limits
    (``0`` = unlimited rate). ``high_percent`` / ``low_percent``: the volume watermarks; a download
    starts only if the volume stays under ``high_percent`` with every running download's remaining
    bytes reserved. ``capacity_bytes``: treat the volume as this big (the cache's own bytes count as
    used). ``on_change(digest, entry_or_None)`` is called (from engine threads, outside its locks,
    possibly from several threads at once) when a digest's state changes or it is removed; it gets
    the entry as it is when the callback runs, so the last call for a digest always carries its
    current state. ``clock``: epoch seconds, for tests. ``penalties``: the sources that failed lately,
    tried after the others by every download (``SourcePenalties()`` when not given).
    ``removal_delay`` / ``partial_retention``: seconds a published tree / partial work of a digest out
    of ``spec.models`` stays on disk (see ``capacity``). ``fan_out``: how downloads take what the
    tickets' peers hold (``peering``; the glue builds it); without it they fetch from the hubs only.
    ``rate_clock`` / ``rate_sleep``: the monotonic seconds and the wait of the node's rate limiter, for
    tests.
    """

    def __init__(
        self,
        root,
        *,
        settings: DownloadSettings | None = None,
        concurrency: int = 8,
        bytes_per_second: int = 0,
        high_percent: float = 80,
        low_percent: float = 70,
        capacity_bytes: int | None = None,
        on_change: Callable[[str, Entry | None], None] | None = None,
        metrics=None,
        clock: Callable[[], float] = time.time,
        retry_base: float = BACKOFF_INITIAL_SECONDS,
        penalties: SourcePenalties | None = None,
        removal_delay: float = 60.0,
        partial_retention: float = 86400.0,
        fan_out: FanOutFactory | None = None,
        rate_clock: Callable[[], float] = time.monotonic,
        rate_sleep: Callable[[float], None] = time.sleep,
    ):
        self.cache = Cache(root, capacity_bytes=capacity_bytes)
        self.settings = settings or DownloadSettings()
        self.limits = Limits(concurrency, bytes_per_second, clock=rate_clock, sleep=rate_sleep)
        self.penalties = penalties if penalties is not None else SourcePenalties()
        self._on_change = on_change
        self._clock = clock
        self._lock = threading.RLock()
        self._records = Records(self.cache)
        self._retention = Retention(
            self._records, self._downloads, removal_delay=removal_delay, partial_retention=partial_retention
        )
        self._capacity = Capacity(
            self.cache, self._retention, self._downloads, high_percent=high_percent, low_percent=low_percent
        )
        self._jobs = Jobs(
            self._records,
            self._retention,
            self._capacity,
            lock=self._lock,
            view=self._entry,
            emit=self._emit,
            clock=clock,
            retry_base=retry_base,
            limits=self.limits,
            settings=self.settings,
            penalties=self.penalties,
            fan_out=fan_out,
            metrics=metrics,
        )
        self._records.load()
        if metrics is not None:
            metrics.attach(self)

    def _downloads(self) -> dict[str, Download]:
        return self._jobs.downloads()

    # ---------------------------------------------------------------- entries and events

    def _entry(self, item: Item) -> Entry:
        """Caller holds the lock."""
        running = self._jobs.downloads().get(item.digest)
        wanted = self._retention.wanted_of(item.digest)
        return entry_of(item, running, wanted, self._retention.removal_time(item))

    def _emit(self, digest: str) -> None:
        if self._on_change is None:
            return
        entry = self.entry(digest)
        try:
            self._on_change(digest, entry)
        except Exception:
            log.exception("state-change callback failed for %s", digest)

    def entry(self, digest: str) -> Entry | None:
        with self._lock:
            item = self._records.get(digest)
            return self._entry(item) if item is not None else None

    def entries(self) -> list[Entry]:
        """One entry per digest the node holds or works on, sorted by digest."""
        with self._lock:
            return [self._entry(item) for _, item in sorted(self._records.items.items())]

    def running(self) -> list[dict]:
        """The downloads in progress: ``digest, downloadedBytes, sizeBytes, source, bytesPerSecond``."""
        return self._jobs.running()

    def written(self, digest: str) -> list[tuple[str, int, list[list[int]]]] | None:
        """The files of the running download of ``digest`` with the byte ranges on disk so far
        (``Download.written``; they are under ``cache.partial_tree(digest)``), or ``None`` when no
        download of it runs. Read-only."""
        return self._jobs.written(digest)

    def stats(self, digest: str) -> dict | None:
        """Counters of the running or last download of ``digest`` in this process: ``requests``,
        ``network_bytes``, ``resumed_bytes`` (found on disk from an earlier attempt),
        ``reread_bytes`` (read back from disk to hash), ``retries``, ``seconds``."""
        return self._jobs.stats(digest)

    def path(self, digest: str) -> Path | None:
        """The published tree of ``digest``, or ``None``."""
        tree = self.cache.tree(digest)
        return tree if tree.is_dir() else None

    # ---------------------------------------------------------------- capacity and settings

    def capacity(self) -> dict:
        """``totalBytes`` of the volume, ``storedBytes`` of the cache, ``usedPercent`` of the volume."""
        with self._lock:
            stored = self._capacity.stored_bytes()
        return self._capacity.report(stored)

    def capacity_low(self) -> bool:
        """True from the moment the volume reaches the high watermark until it is back at the low one."""
        self.capacity()
        return self._capacity.low_on_room

    def set_limits(self, concurrency: int | None = None, bytes_per_second: int | None = None) -> None:
        """Node-wide parallel connections and bytes per second (0 = unlimited), effective at once."""
        self.limits.set(concurrency, bytes_per_second)

    def set_watermarks(self, high: float, low: float) -> None:
        with self._lock:
            self._capacity.set_watermarks(high, low)

    def watermarks(self) -> tuple[float, float]:
        """The volume's ``(high, low)`` watermarks in percent, as the store's spec set them last."""
        return self._capacity.high, self._capacity.low

    # ---------------------------------------------------------------- downloads

    def ensure(self, ticket: FetchTicket, *, force: bool = False) -> Entry | None:
        """Make sure ``ticket.digest`` is on the node: ``Ready`` if published (no request made), the
        running download if there is one, else start one, unless the digest failed and its
        ``retryTime`` has not come (``force`` overrides). Returns the digest's entry. Once the spec is
        known (``set_wanted``), a digest it does not reference is left as it is (its entry, or ``None``).

        A ticket whose digest is not ``sha256:<hex>`` raises ``DownloadFailed(InvalidRequest)``;
        any other problem with the ticket is recorded as a ``Failed`` entry."""
        return self._jobs.ensure(ticket, force=force)

    def cancel(self, digest: str, *, wait: float | None = None) -> bool:
        """Stop the running download of ``digest`` (recorded ``Failed``/``Canceled``, its partial
        work kept for a later ``ensure``); True if one was running. ``wait``: seconds to wait for it."""
        return self._jobs.cancel(digest, wait=wait)

    def wait(self, digest: str, timeout: float | None = None) -> Entry | None:
        """Wait until ``digest`` is not downloading any more (or ``timeout``); its entry."""
        return self._jobs.wait(digest, timeout)

    def touch(self, digest: str) -> None:
        """Note that the published tree of ``digest`` was used now (persisted at most once a minute)."""
        with self._lock:
            item = self._records.get(digest)
            if item is not None and item.state == READY:
                self._records.touch(item, self._clock())

    # ---------------------------------------------------------------- what holds a digest

    def set_mounted(self, digests: Iterable[str]) -> None:
        """The digests Pods on this node have mounted now: held whatever ``spec.models`` says (never
        removed, never evicted). A digest no longer mounted and out of ``spec.models`` gets its removal
        delay counted from now."""
        now = self._clock()
        with self._lock:
            self._retention.set_mounted(digests, now)

    def mounted(self) -> frozenset[str]:
        with self._lock:
            return self._retention.mounted

    def touch_mounted(self, interval: float) -> list[str]:
        """Note the use of every mounted Ready tree last used ``interval`` seconds ago or more (each
        reported as a change); the digests touched."""
        now = self._clock()
        with self._lock:
            touched = self._retention.touch_mounted(now, interval)
        for digest in touched:
            self._emit(digest)
        return touched

    def set_wanted(self, items: Iterable[Wanted | dict]) -> None:
        """The store's ``spec.models`` (``Wanted`` or spec items): which digests are referenced,
        unreferenced (with a collect time) or pinned. Notes when a digest leaves or comes back, and
        stops the running download of a digest no longer referenced (its partial work kept)."""
        with self._lock:
            self._retention.set_wanted(items, self._clock())
        self._jobs.stop_unreferenced()

    def collect(self) -> list[str]:
        """Remove what stayed out of ``spec.models`` past its delay, then evict while the volume is
        above its high watermark; nothing before the spec is known. Returns the digests removed."""
        now = self._clock()
        with self._lock:
            removed = self._capacity.collect(now)
        for digest in removed:
            self._emit(digest)
        return removed

    def remove(self, digest: str) -> bool:
        """Delete ``digest`` from the node now (a running download is stopped first)."""
        self._jobs.stop(digest, "removed from this node", timeout=30)
        with self._lock:
            known = self._records.get(digest) is not None or self.cache.published(digest)
            self._records.remove(digest)
        if known:
            self._emit(digest)
        return known

    def close(self, timeout: float = 30.0) -> None:
        """Stop every running download, keeping it resumable (it stays ``Downloading`` on disk)."""
        self._jobs.close(timeout)
