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

Collection: a published tree whose digest left ``spec.models`` is removed ``removal_delay`` seconds
after the engine saw it leave; partial work and failure records of such a digest after
``partial_retention`` seconds. Disk pressure: while the volume is above the high watermark, and before
a download is refused for lack of room, Ready trees neither pinned nor referenced and partial work out
of ``spec.models`` are evicted, least recently used first, down to the low watermark (or until the
download fits). A referenced or pinned tree and a running download are never evicted.

Everything the engine knows survives a restart: published trees are found on disk (``Ready``
without a request), interrupted downloads resume from their checkpoints, failure counts, retry
times, last use and "absent since" times are persisted per digest (so a restart neither resets
nor skips a removal delay).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpustack_models.kinds import nodemodelstore
from gpustack_models.plugin.engine.cache import Cache, read_json
from gpustack_models.plugin.engine.checkpoint import CHECKPOINT_VERSION
from gpustack_models.plugin.engine.disk import DiskError, disk_failure
from gpustack_models.plugin.engine.download import Download, DownloadSettings, Limits
from gpustack_models.plugin.engine.failures import (
    BACKOFF_INITIAL_SECONDS,
    CANCELED,
    INSUFFICIENT_CAPACITY,
    INVALID_REQUEST,
    SOURCE_UNAVAILABLE,
    DownloadFailed,
    SourcePenalties,
    backoff_seconds,
)
from gpustack_models.plugin.engine.lifecycle import Wanted
from gpustack_models.plugin.engine.ticket import FetchTicket, digest_hex
from gpustack_models.plugin.peers.peer_client import PeerAccess
from gpustack_models.plugin.peers.swarm import SwarmSettings

log = logging.getLogger(__name__)

# The states of a digest on a node, as the NodeModelStore reports them (the one definition of the kind).
DOWNLOADING, READY, FAILED = nodemodelstore.DOWNLOADING, nodemodelstore.READY, nodemodelstore.FAILED
SOURCE_HUB, SOURCE_PEER = nodemodelstore.SOURCE_HUB, nodemodelstore.SOURCE_PEER
_TOUCH_PERSIST_SECONDS = 60.0


def source_of(by_source: dict[str, int]) -> str:
    """``Peer`` when most bytes received came from peers, else ``Hub``."""
    hub = by_source.get("hub", 0)
    return SOURCE_PEER if sum(by_source.values()) - hub > hub else SOURCE_HUB


def _by_source(by_source: dict[str, int]) -> str:
    peers = sorted((n, b) for n, b in by_source.items() if n != "hub")
    listed = ", ".join(f"{node} {n}" for node, n in peers)
    return f"hub {by_source.get('hub', 0)}" + (f", peers {sum(b for _, b in peers)} ({listed})" if peers else "")


def _log_finished(digest: str, failure: DownloadFailed | None, stats: dict, seconds: float) -> None:
    log.info(
        "download %s %s: %d bytes fetched in %.1f s (%.1f MB/s), %d requests, %d retries, %d bytes resumed,"
        " %d bytes linked; bytes by source: %s%s",
        digest[:19],
        "ready" if failure is None else f"failed ({failure})",
        stats["network_bytes"],
        seconds,
        stats["network_bytes"] / max(seconds, 1e-6) / 1e6,
        stats["requests"],
        stats["retries"],
        stats["resumed_bytes"],
        stats["linked_bytes"],
        _by_source(stats.get("by_source") or {}),
        f"; banned peers: {', '.join(stats['banned'])}" if stats.get("banned") else "",
    )


def rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(int(epoch), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Entry:
    """What the node holds or works on for one digest (a NodeModelStore ``status.models`` item)."""

    digest: str
    state: str  # Downloading | Ready | Failed
    size_bytes: int
    downloaded_bytes: int
    reason: str | None = None
    message: str | None = None
    retry_time: float | None = None  # epoch seconds
    last_used_time: float | None = None  # epoch seconds
    source: str = SOURCE_HUB
    pinned: bool = False
    collect_time: float | None = None  # epoch seconds: when the node removes it unless referenced again

    def status(self) -> dict:
        """The status item: camelCase keys, RFC 3339 times, absent fields left out."""
        out = {
            "digest": self.digest,
            "state": self.state,
            "sizeBytes": self.size_bytes,
            "downloadedBytes": self.downloaded_bytes,
            "reason": self.reason,
            "message": self.message,
            "retryTime": rfc3339(self.retry_time),
            "lastUsedTime": rfc3339(self.last_used_time),
            "source": self.source,
            "pinned": True if self.pinned else None,
            "collectTime": rfc3339(self.collect_time),
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass
class _Item:
    """The engine's knowledge of one digest; ``record()`` is what is persisted."""

    digest: str
    state: str | None = None
    size: int = 0
    downloaded: int = 0
    failures: int = 0
    reason: str | None = None
    message: str | None = None
    retry_time: float | None = None
    last_used: float | None = None
    last_used_saved: float | None = None
    absent_since: float | None = None
    source: str = SOURCE_HUB

    def record(self) -> dict:
        return {
            "digest": self.digest,
            "state": self.state,
            "sizeBytes": self.size,
            "downloadedBytes": self.downloaded,
            "failures": self.failures,
            "reason": self.reason,
            "message": self.message,
            "retryTime": self.retry_time,
            "lastUsedTime": self.last_used,
            "absentSince": self.absent_since,
            "source": self.source,
        }

    @classmethod
    def from_record(cls, digest: str, record: dict) -> _Item:
        def number(key):
            value = record.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        def integer(key):
            value = record.get(key)
            return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

        def text(key):
            value = record.get(key)
            return value if isinstance(value, str) else None

        item = cls(digest)
        item.state = text("state") if record.get("state") in (DOWNLOADING, READY, FAILED) else None
        item.size = integer("sizeBytes")
        item.downloaded = integer("downloadedBytes")
        item.failures = integer("failures")
        item.reason, item.message = text("reason"), text("message")
        item.retry_time = number("retryTime")
        item.last_used = item.last_used_saved = number("lastUsedTime")
        item.absent_since = number("absentSince")
        item.source = SOURCE_PEER if record.get("source") == SOURCE_PEER else SOURCE_HUB
        return item


@dataclass
class _Job:
    download: Download
    thread: threading.Thread | None = None
    reserved: bool = False
    shutdown: bool = False
    done: threading.Event = field(default_factory=threading.Event)


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
    of ``spec.models`` stays on disk (see the module's docstring). ``node`` and ``peers``: this node's
    name and how it reaches other nodes' plugins, so downloads take what the tickets' peers hold
    (``fanout``; ``swarm`` its tuning). ``rate_clock`` / ``rate_sleep``: the monotonic seconds and the wait
    of the node's rate limiter, for tests.
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
        node: str = "",
        peers: PeerAccess | None = None,
        swarm: SwarmSettings | None = None,
        rate_clock: Callable[[], float] = time.monotonic,
        rate_sleep: Callable[[float], None] = time.sleep,
    ):
        self.cache = Cache(root, capacity_bytes=capacity_bytes)
        self.settings = settings or DownloadSettings()
        self.limits = Limits(concurrency, bytes_per_second, clock=rate_clock, sleep=rate_sleep)
        self._high = float(high_percent)
        self._low = float(low_percent)
        self._check_watermarks(self._high, self._low)
        self._capacity_low = False
        self._on_change = on_change
        self._metrics = metrics
        self._clock = clock
        self._retry_base = float(retry_base)
        self.penalties = penalties if penalties is not None else SourcePenalties()
        self._lock = threading.RLock()
        self._items: dict[str, _Item] = {}
        self._jobs: dict[str, _Job] = {}
        self._idle_partial: dict[str, int] = {}  # bytes on disk of partial work not running now
        self._last_stats: dict[str, dict] = {}  # counters of each digest's last download
        self._closed = False
        self._wanted: dict[str, Wanted] | None = None  # spec.models by digest; None until the spec is known
        self._mounted: frozenset[str] = frozenset()  # digests a Pod has mounted: never removed nor evicted
        self._removal_delay = float(removal_delay)
        self._partial_retention = float(partial_retention)
        self._node, self._peers, self._swarm = node, peers, swarm
        self._load()
        if metrics is not None:
            metrics.attach(self)

    # ---------------------------------------------------------------- start-up

    def _load(self) -> None:
        cache = self.cache
        published = set(cache.published_digests())
        partial = set(cache.partial_digests())
        for digest in partial & published:
            cache.remove_partial(digest)  # left over from a crash right after publishing
        partial -= published
        for digest in sorted(set(cache.recorded_digests()) | published | partial):
            record = cache.load_record(digest)
            item = _Item.from_record(digest, record) if record else _Item(digest)
            if digest in published:
                if item.state != READY or not item.size:
                    item.size = cache.tree_size(digest)
                item.state, item.downloaded = READY, item.size
                item.reason = item.message = None
                item.retry_time, item.failures = None, 0
            elif digest in partial:
                size, downloaded = self._checkpoint_progress(digest)
                item.size = size or item.size
                item.downloaded = downloaded
                if item.state not in (DOWNLOADING, FAILED):
                    item.state = DOWNLOADING
                self._idle_partial[digest] = cache.partial_bytes(digest)
            elif item.state == READY or item.state is None:
                cache.delete_record(digest)  # the tree is gone: nothing left to report
                continue
            else:
                item.downloaded = 0
            self._items[digest] = item
            if record != item.record():
                self._persist(item)

    def _checkpoint_progress(self, digest: str) -> tuple[int, int]:
        document = read_json(self.cache.checkpoint_path(digest))
        if not isinstance(document, dict) or document.get("version") != CHECKPOINT_VERSION:
            return 0, 0
        size = downloaded = 0
        for entry in (document.get("files") or {}).values():
            if not isinstance(entry, dict):
                continue
            file_size = entry.get("size") if isinstance(entry.get("size"), int) else 0
            size += file_size
            if entry.get("verified"):
                downloaded += file_size
            elif isinstance(entry.get("hashed"), int):
                downloaded += entry["hashed"]
        return size, downloaded

    # ---------------------------------------------------------------- persistence and events

    def _persist(self, item: _Item) -> None:
        try:
            self.cache.save_record(item.digest, item.record())
            item.last_used_saved = item.last_used
        except OSError:
            log.exception("cannot save the state of %s", item.digest)

    def _emit(self, digest: str) -> None:
        if self._on_change is None:
            return
        entry = self.entry(digest)
        try:
            self._on_change(digest, entry)
        except Exception:
            log.exception("state-change callback failed for %s", digest)

    def _entry(self, item: _Item) -> Entry:
        job = self._jobs.get(item.digest)
        downloaded = job.download.downloaded_bytes if job is not None else item.downloaded
        state = DOWNLOADING if job is not None else item.state
        source = source_of(job.download.source_bytes) if job is not None else item.source
        failed = state == FAILED
        wanted = self._wanted.get(item.digest) if self._wanted is not None else None
        return Entry(
            digest=item.digest,
            state=state,
            size_bytes=item.size,
            downloaded_bytes=min(downloaded, item.size) if item.size else downloaded,
            reason=item.reason if failed else None,
            message=item.message if failed else None,
            retry_time=item.retry_time if failed else None,
            last_used_time=item.last_used,
            source=source,
            pinned=wanted is not None and wanted.pinned,
            collect_time=wanted.collect_time if wanted is not None else self._removal_time(item),
        )

    # ---------------------------------------------------------------- queries

    def entry(self, digest: str) -> Entry | None:
        with self._lock:
            item = self._items.get(digest)
            return self._entry(item) if item is not None else None

    def entries(self) -> list[Entry]:
        """One entry per digest the node holds or works on, sorted by digest."""
        with self._lock:
            return [self._entry(item) for _, item in sorted(self._items.items())]

    def running(self) -> list[dict]:
        """The downloads in progress: ``digest, downloadedBytes, sizeBytes, source``."""
        with self._lock:
            jobs = list(self._jobs.items())
        return [
            {
                "digest": digest,
                "downloadedBytes": job.download.downloaded_bytes,
                "sizeBytes": job.download.size,
                "source": source_of(job.download.source_bytes),
            }
            for digest, job in sorted(jobs)
        ]

    def written(self, digest: str) -> list[tuple[str, int, list[list[int]]]] | None:
        """The files of the running download of ``digest`` with the byte ranges on disk so far
        (``Download.written``; they are under ``cache.partial_tree(digest)``), or ``None`` when no
        download of it runs. Read-only."""
        with self._lock:
            job = self._jobs.get(digest)
        return job.download.written() if job is not None else None

    def stats(self, digest: str) -> dict | None:
        """Counters of the running or last download of ``digest`` in this process: ``requests``,
        ``network_bytes``, ``resumed_bytes`` (found on disk from an earlier attempt),
        ``reread_bytes`` (read back from disk to hash), ``retries``, ``seconds``."""
        with self._lock:
            job = self._jobs.get(digest)
            if job is not None:
                return dict(job.download.stats)
            stats = self._last_stats.get(digest)
            return dict(stats) if stats is not None else None

    def path(self, digest: str) -> Path | None:
        """The published tree of ``digest``, or ``None``."""
        tree = self.cache.tree(digest)
        return tree if tree.is_dir() else None

    def _stored_bytes(self) -> int:
        """The published trees (an inode several trees share counted once), partial work, and what the
        running downloads wrote (not what they linked from the trees). Caller holds the lock."""
        stored = self.cache.shared.stored_bytes()
        stored += sum(self._idle_partial.values())
        stored += sum(d.size - d.remaining_bytes - d.linked_bytes for d in (j.download for j in self._jobs.values()))
        return stored

    def capacity(self) -> dict:
        """``totalBytes`` of the volume, ``storedBytes`` of the cache, ``usedPercent`` of the volume."""
        with self._lock:
            stored = self._stored_bytes()
        total, used = self.cache.volume(stored)
        percent = round(100.0 * used / total) if total else 100
        if percent >= self._high:
            self._capacity_low = True
        elif percent <= self._low:
            self._capacity_low = False
        return {"totalBytes": total, "storedBytes": stored, "usedPercent": percent}

    def capacity_low(self) -> bool:
        """True from the moment the volume reaches the high watermark until it is back at the low one."""
        self.capacity()
        return self._capacity_low

    # ---------------------------------------------------------------- settings

    def set_limits(self, concurrency: int | None = None, bytes_per_second: int | None = None) -> None:
        """Node-wide parallel connections and bytes per second (0 = unlimited), effective at once."""
        self.limits.set(concurrency, bytes_per_second)

    @staticmethod
    def _check_watermarks(high: float, low: float) -> None:
        if not (0 < low <= high <= 100):
            raise ValueError("watermarks must satisfy 0 < low <= high <= 100")

    def set_watermarks(self, high: float, low: float) -> None:
        self._check_watermarks(float(high), float(low))
        with self._lock:
            self._high, self._low = float(high), float(low)

    # ---------------------------------------------------------------- downloads

    def ensure(self, ticket: FetchTicket, *, force: bool = False) -> Entry | None:
        """Make sure ``ticket.digest`` is on the node: ``Ready`` if published (no request made), the
        running download if there is one, else start one, unless the digest failed and its
        ``retryTime`` has not come (``force`` overrides). Returns the digest's entry. Once the spec is
        known (``set_wanted``), a digest it does not reference is left as it is (its entry, or ``None``).

        A ticket whose digest is not ``sha256:<hex>`` raises ``DownloadFailed(InvalidRequest)``;
        any other problem with the ticket is recorded as a ``Failed`` entry."""
        digest = ticket.digest
        try:
            digest_hex(digest)
        except ValueError:
            raise DownloadFailed(INVALID_REQUEST, f"not a manifest digest: {digest!r}") from None
        now = self._clock()
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if not self._referenced(digest):
                known = self._items.get(digest)
                return self._entry(known) if known is not None else None
            item, changed = self._wanted_item(digest)
            if self.cache.published(digest) and digest not in self._jobs:
                changed = self._found_published(item) or changed
                self._touch(item, now, persist=changed)
            elif self._running_or_backing_off(item, now, force):
                if changed:
                    self._persist(item)
                return self._entry(item)
            else:
                self._start_or_refuse(item, ticket, now)
                changed = True
            entry = self._entry(item)
        if not changed:
            return entry
        self._emit(digest)
        return self.entry(digest)

    def _wanted_item(self, digest: str) -> tuple[_Item, bool]:
        """The item of ``digest`` (created if new), no longer absent; True if that changed it.
        Caller holds the lock."""
        item = self._items.get(digest)
        if item is None:
            item = self._items[digest] = _Item(digest)
        if item.absent_since is None:
            return item, False
        item.absent_since = None
        return item, True

    def _found_published(self, item: _Item) -> bool:
        """``item``'s tree is published: ``Ready`` with the tree's size; True if that changed it.
        Caller holds the lock."""
        if item.state == READY:
            return False
        item.state, item.size = READY, self.cache.tree_size(item.digest)
        item.downloaded = item.size
        return True

    def _running_or_backing_off(self, item: _Item, now: float, force: bool) -> bool:
        """Caller holds the lock."""
        if item.digest in self._jobs:
            return True
        return item.state == FAILED and item.retry_time is not None and now < item.retry_time and not force

    def _start_or_refuse(self, item: _Item, ticket: FetchTicket, now: float) -> None:
        """Start the download of a valid ticket, else record why it is not. Caller holds the lock."""
        try:
            ticket.validate()
        except DownloadFailed as failure:
            self._record_failure(item, failure, now)
        else:
            self._start(item, ticket)

    def _start(self, item: _Item, ticket: FetchTicket) -> None:
        """Caller holds the lock."""
        download = Download(
            ticket,
            self.cache,
            self.limits,
            self.settings,
            on_bytes=self._count_bytes,
            penalties=self.penalties,
            node=self._node,
            peers=self._peers,
            on_peer_bytes=self._count_peer_bytes,
            swarm=self._swarm,
        )
        job = _Job(download)
        self._jobs[item.digest] = job
        self._idle_partial.pop(item.digest, None)
        item.state, item.size = DOWNLOADING, ticket.size
        item.reason = item.message = None
        self._persist(item)
        job.thread = threading.Thread(
            target=self._run, args=(item.digest, job), name=f"fetch-{ticket.hex[:12]}", daemon=True
        )
        job.thread.start()

    def _count_bytes(self, n: int) -> None:
        if self._metrics is not None:
            self._metrics.bytes_downloaded(n)

    def _count_peer_bytes(self, node: str, n: int) -> None:
        if self._metrics is not None:
            self._metrics.bytes_from_peer(node, n)

    def _reserve(self, digest: str, job: _Job) -> None:
        """Refuse the download unless the volume takes its remaining bytes under the high watermark,
        counting what every other running download still has to write; evict what may be evicted
        (least recently used first) when that makes it fit."""
        with self._lock:
            remaining = job.download.remaining_bytes
            others = sum(j.download.remaining_bytes for d, j in self._jobs.items() if d != digest and j.reserved)
            total, used = self.cache.volume(self._stored_bytes())
            limit = total * self._high / 100.0
            evicted = self._make_room(used + others + remaining - limit, f"to make room for {digest[:19]}")
            if evicted:
                total, used = self.cache.volume(self._stored_bytes())
            fits = used + others + remaining <= limit
            job.reserved = fits
        for gone in evicted:
            self._emit(gone)
        if not fits:
            raise DownloadFailed(
                INSUFFICIENT_CAPACITY,
                f"needs {remaining} more bytes, {max(0, int(limit - used - others))} bytes are free under the"
                f" volume's {self._high:g}% watermark ({used} of {total} bytes used, {others} reserved by other"
                " downloads)",
            )

    def _run(self, digest: str, job: _Job) -> None:
        started = time.monotonic()
        failure = self._download(digest, job)
        now = self._clock()
        seconds = time.monotonic() - started
        stats = dict(job.download.stats, seconds=round(seconds, 3), by_source=job.download.source_bytes)
        if job.download.fanout is not None:
            stats["banned"] = job.download.fanout.banned()
        _log_finished(digest, failure, stats, seconds)
        if self._metrics is not None and stats["linked_bytes"]:
            self._metrics.bytes_linked(stats["linked_bytes"])
        with self._lock:
            self._last_stats[digest] = stats
            item = self._items.get(digest)
            self._jobs.pop(digest, None)
            if item is not None:
                self._settle(item, job, failure, now)
        job.done.set()
        if not job.shutdown:
            self._emit(digest)

    def _download(self, digest: str, job: _Job) -> DownloadFailed | None:
        """Reserve the capacity and run the download; its failure, or ``None`` once published."""
        try:
            try:
                job.download.prepare()
            except (DiskError, OSError) as exc:
                raise disk_failure(exc) from None
            if self._metrics is not None:
                self._metrics.bytes_resumed(job.download.stats["resumed_bytes"])
            self._reserve(digest, job)
            job.download.run()
        except DownloadFailed as exc:
            return exc
        except Exception as exc:  # never leave a digest stuck in Downloading
            log.exception("download of %s crashed", digest)
            return DownloadFailed(SOURCE_UNAVAILABLE, f"unexpected error: {type(exc).__name__}: {exc}")
        return None

    def _settle(self, item: _Item, job: _Job, failure: DownloadFailed | None, now: float) -> None:
        """Record how the download of ``item`` ended. Caller holds the lock."""
        item.downloaded = job.download.downloaded_bytes
        if failure is None:
            item.state, item.downloaded = READY, item.size
            item.source = source_of(job.download.source_bytes)
            item.failures, item.reason, item.message, item.retry_time = 0, None, None, None
            self._touch(item, now, persist=True)
            if self._metrics is not None:
                self._metrics.download_finished(READY, None)
        elif job.shutdown:
            self._persist(item)  # stays Downloading: resumed when asked again
        else:
            self._record_failure(item, failure, now)
        if item.state != READY and self.cache.partial(item.digest).exists():
            self._idle_partial[item.digest] = self.cache.partial_bytes(item.digest)

    def _record_failure(self, item: _Item, failure: DownloadFailed, now: float) -> None:
        """Caller holds the lock."""
        item.state, item.reason, item.message = FAILED, failure.reason, failure.message[:1024]
        if failure.reason == CANCELED:
            item.retry_time = None  # the caller's decision, not the hub's fault: no backoff
        else:
            item.failures += 1
            item.retry_time = now + backoff_seconds(item.failures, failure.retry_after, self._retry_base)
        self._persist(item)
        if self._metrics is not None:
            self._metrics.download_finished(FAILED, failure.reason)

    def cancel(self, digest: str, *, wait: float | None = None) -> bool:
        """Stop the running download of ``digest`` (recorded ``Failed``/``Canceled``, its partial
        work kept for a later ``ensure``); True if one was running. ``wait``: seconds to wait for it."""
        with self._lock:
            job = self._jobs.get(digest)
        if job is None:
            return False
        job.download.cancel("cancelled by the node's plugin")
        if wait:
            job.done.wait(wait)
        return True

    def wait(self, digest: str, timeout: float | None = None) -> Entry | None:
        """Wait until ``digest`` is not downloading any more (or ``timeout``); its entry."""
        with self._lock:
            job = self._jobs.get(digest)
        if job is not None:
            job.done.wait(timeout)
        return self.entry(digest)

    def touch(self, digest: str) -> None:
        """Note that the published tree of ``digest`` was used now (persisted at most once a minute)."""
        with self._lock:
            item = self._items.get(digest)
            if item is not None and item.state == READY:
                self._touch(item, self._clock())

    def _touch(self, item: _Item, now: float, *, persist: bool = False) -> None:
        item.last_used = now
        if persist or item.last_used_saved is None or now - item.last_used_saved >= _TOUCH_PERSIST_SECONDS:
            self._persist(item)

    # ---------------------------------------------------------------- mounts

    def set_mounted(self, digests: Iterable[str]) -> None:
        """The digests Pods on this node have mounted now: held whatever ``spec.models`` says (never
        removed, never evicted). A digest no longer mounted and out of ``spec.models`` gets its removal
        delay counted from now."""
        mounted = frozenset(digests)
        now = self._clock()
        with self._lock:
            released = self._mounted - mounted
            self._mounted = mounted
            for digest in released:
                item = self._items.get(digest)
                if item is not None and item.absent_since is not None:
                    item.absent_since = now
                    self._persist(item)

    def mounted(self) -> frozenset[str]:
        with self._lock:
            return self._mounted

    def touch_mounted(self, interval: float) -> list[str]:
        """Note the use of every mounted Ready tree last used ``interval`` seconds ago or more (each
        reported as a change); the digests touched."""
        now = self._clock()
        touched = []
        with self._lock:
            for digest in sorted(self._mounted):
                item = self._items.get(digest)
                if item is None or item.state != READY:
                    continue
                if item.last_used is None or now - item.last_used >= interval:
                    self._touch(item, now, persist=True)
                    touched.append(digest)
        for digest in touched:
            self._emit(digest)
        return touched

    # ---------------------------------------------------------------- collection

    def set_wanted(self, items: Iterable[Wanted | dict]) -> None:
        """The store's ``spec.models`` (``Wanted`` or spec items): which digests are referenced,
        unreferenced (with a collect time) or pinned. Notes when a digest leaves or comes back, and
        stops the running download of a digest no longer referenced (its partial work kept)."""
        wanted: dict[str, Wanted] = {}
        for raw in items:
            item = raw if isinstance(raw, Wanted) else Wanted.from_spec(raw)
            if item is not None:
                wanted[item.digest] = item
        with self._lock:
            self._wanted = wanted
            self._note_absence(self._clock())
            stopping = [j for d, j in self._jobs.items() if not self._referenced(d) and not j.download.cancelled]
        for job in stopping:
            log.info("stopping the download of %s: no longer referenced on this node", job.download.digest[:19])
            job.download.cancel("no longer referenced on this node; the bytes downloaded are kept")

    def _referenced(self, digest: str) -> bool:
        """True unless the spec is known and does not reference ``digest`` (a mounted digest is referenced).
        Caller holds the lock."""
        if self._wanted is None or digest in self._mounted:
            return True
        wanted = self._wanted.get(digest)
        return wanted is not None and wanted.referenced

    def _note_absence(self, now: float) -> None:
        """Note when each digest left ``spec.models`` or came back (persisted). Caller holds the lock."""
        for digest, item in self._items.items():
            if digest in self._wanted:
                absent_since = None
            elif item.absent_since is None or item.absent_since > now:
                absent_since = now
            else:
                continue
            if item.absent_since != absent_since:
                item.absent_since = absent_since
                self._persist(item)

    def _removal_time(self, item: _Item) -> float | None:
        """When the engine removes ``item`` (out of ``spec.models``), else ``None``. Caller holds the lock."""
        if self._wanted is None or item.absent_since is None or item.digest in self._wanted:
            return None
        if item.digest in self._mounted:
            return None
        published = item.state == READY and item.digest not in self._jobs
        return item.absent_since + (self._removal_delay if published else self._partial_retention)

    def collect(self) -> list[str]:
        """Remove what stayed out of ``spec.models`` past its delay, then evict while the volume is
        above its high watermark; nothing before the spec is known. Returns the digests removed."""
        now = self._clock()
        with self._lock:
            if self._wanted is None:
                return []
            self._note_absence(now)
            removed = []
            for digest, item in list(self._items.items()):
                removal = self._removal_time(item)
                if removal is not None and now >= removal and digest not in self._jobs:
                    why = "out of spec.models" if item.state == READY else "partial work out of spec.models"
                    self._remove_logged(item, f"{why} for {now - item.absent_since:.0f}s")
                    removed.append(digest)
            removed += self._relieve_pressure()
        for digest in removed:
            self._emit(digest)
        return removed

    def _held_bytes(self, item: _Item) -> int:
        """Bytes removing ``item`` gives back when nothing runs for it (of a tree: the files no other
        tree shares). Caller holds the lock."""
        if item.state == READY:
            return self.cache.shared.exclusive_bytes(item.digest)
        return self._idle_partial.get(item.digest, 0)

    def _freeable(self, items: list[_Item]) -> int:
        """Bytes removing all of ``items`` gives back (files they alone share counted once). Caller holds the lock."""
        trees = [item.digest for item in items if item.state == READY]
        return self.cache.shared.freed_bytes(trees) + sum(
            self._idle_partial.get(item.digest, 0) for item in items if item.state != READY
        )

    def _remove_logged(self, item: _Item, why: str) -> None:
        """Caller holds the lock."""
        log.info("removed %s (%d bytes): %s", item.digest, self._held_bytes(item), why)
        self._remove(item.digest)

    # ---------------------------------------------------------------- disk pressure

    def _evictable(self) -> list[_Item]:
        """What disk pressure may take, least recently used first (never used: oldest): Ready trees
        neither pinned nor referenced, and partial work out of ``spec.models``; never a running
        download. Nothing before the spec is known. Caller holds the lock."""
        if self._wanted is None:
            return []
        out = []
        for digest, item in self._items.items():
            wanted = self._wanted.get(digest)
            if digest in self._jobs or digest in self._mounted:
                continue
            if wanted is not None and (wanted.referenced or wanted.pinned):
                continue
            if item.state == READY or (wanted is None and self._idle_partial.get(digest)):
                out.append(item)
        return sorted(out, key=lambda i: (i.last_used if i.last_used is not None else float("-inf"), i.digest))

    def _used_percent(self) -> int:
        """Caller holds the lock."""
        total, used = self.cache.volume(self._stored_bytes())
        return round(100.0 * used / total) if total else 100

    def _relieve_pressure(self) -> list[str]:
        """Above the high watermark, evict down to the low one; the digests evicted. Caller holds the lock."""
        percent = self._used_percent()
        if percent <= self._high:
            return []
        evicted = []
        for item in self._evictable():
            if percent <= self._low:
                break
            self._evict(item, f"the volume is at {percent}% (high {self._high:g}%, low {self._low:g}%)")
            evicted.append(item.digest)
            percent = self._used_percent()
        return evicted

    def _make_room(self, excess: float, why: str) -> list[str]:
        """Evict, least recently used first, until ``excess`` bytes are freed; nothing if everything
        that may be evicted would not free that much. Caller holds the lock."""
        if excess <= 0:
            return []
        candidates = self._evictable()
        if self._freeable(candidates) < excess:
            return []
        evicted = []
        for item in candidates:
            if excess <= 0:
                break
            excess -= self._held_bytes(item)
            reason = f"{why} (volume at {self._used_percent()}%, high {self._high:g}%, low {self._low:g}%)"
            self._evict(item, reason)
            evicted.append(item.digest)
        return evicted

    def _evict(self, item: _Item, why: str) -> None:
        """Caller holds the lock."""
        log.info(
            "evicted %s (%d bytes, last used %s): %s",
            item.digest,
            self._held_bytes(item),
            rfc3339(item.last_used) or "never",
            why,
        )
        self._remove(item.digest)

    def _remove(self, digest: str) -> None:
        """Caller holds the lock."""
        self.cache.remove(digest)
        self.cache.delete_record(digest)
        self._items.pop(digest, None)
        self._idle_partial.pop(digest, None)
        self._last_stats.pop(digest, None)

    def remove(self, digest: str) -> bool:
        """Delete ``digest`` from the node now (a running download is stopped first)."""
        with self._lock:
            job = self._jobs.get(digest)
        if job is not None:
            job.shutdown = True
            job.download.cancel("removed from this node")
            job.done.wait(30)
        with self._lock:
            known = digest in self._items or self.cache.published(digest)
            self._remove(digest)
        if known:
            self._emit(digest)
        return known

    # ---------------------------------------------------------------- shutdown

    def close(self, timeout: float = 30.0) -> None:
        """Stop every running download, keeping it resumable (it stays ``Downloading`` on disk)."""
        with self._lock:
            self._closed = True
            jobs = list(self._jobs.values())
        for job in jobs:
            job.shutdown = True
            job.download.cancel("the plugin is stopping")
        deadline = time.monotonic() + timeout
        for job in jobs:
            job.done.wait(max(0.0, deadline - time.monotonic()))
