"""The resumable, verifying range downloader: one ``Download`` per manifest digest.

How a digest is fetched (``Download`` runs the steps; each has its module):

1. ``prepare()`` opens the files of the partial tree (``tree``, which also closes, checkpoints and
   sets them aside), reads the checkpoint of earlier attempts (``checkpoint``) and works out what is
   missing: files already verified are not touched again; a file whose checksum a Ready tree of the
   node holds is hard-linked from it (``sharing``) and counts as verified; for the others, the byte
   ranges already written and the hash state of their contiguous hashed prefix are restored
   (``ranges`` keeps a file's written ranges, hash frontier and hash).
2. The missing bytes become *parts* (files inside a compressed layer of a registry are read out of their
   layer instead, one stream per layer: ``layers``): a small file is one part (one request); a file of at least
   ``split_threshold`` bytes is cut into ``part_size`` pieces fetched in parallel. Parts are handed
   out in file order, so the bytes of a file arrive roughly in order (``Parts``); when none is left,
   an idle thread takes the second half of the longest part still being read (its request stops at
   the cut), so the last parts do not leave connections idle while one reads a long tail.
3. Fetching threads take a node-wide connection slot, then the next part, and fetch it (``fetch``)
   with an HTTP ``Range`` request, reading straight into a reusable buffer and writing it with
   ``pwrite`` at its offset. Every read first takes its bytes from the node-wide rate limiter. A
   read that stalls (no byte for ``stall_timeout``) or a connection that drops is retried from the
   part's last written byte, at most ``range_retries`` times. A source of the ticket that refuses or
   fails a part hands it over to the next source (from its last written byte); the part fails only
   when every source failed.
4. Each file is hashed while it is written (``frontier``): the thread that wrote the bytes at the
   file's hash frontier hashes them from its buffer; bytes that arrived ahead of the frontier (other
   parts) are hashed from disk when the frontier reaches them. The hash is sha256 (LFS and
   ModelScope files) or the git blob sha1, computed by ``hashing.FileHash`` whose state can be saved.
5. Every ``checkpoint_interval`` seconds the coordinator makes the written bytes durable
   (``fdatasync``) and then replaces the checkpoint with, per file, the written ranges, the hash
   frontier and the hash state at that frontier. After ``kill -9`` a new process resumes from there:
   it requests only the ranges not in the checkpoint and does not read the hashed prefix again.
6. When a file's frontier reaches its size, its digest is compared with the manifest's; a mismatch
   fails the download with ``IntegrityMismatch`` and that file's partial data is discarded.
7. After all files (``publish``): each file's size and hash are checked once more against the
   manifest, the manifest digest is recomputed from the verified files and compared with the
   ticket's, the files are made durable, and the tree is published with one ``rename``. An
   unverified tree is never published.

Failures raise ``DownloadFailed`` with one of the node's reasons (see ``failures``); a disk error
(``disk.DiskError``) is never retried and maps to ``InsufficientCapacity`` when the volume is full.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpustack_models.plugin.engine import layers
from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.checkpoint import CHECKPOINT_VERSION
from gpustack_models.plugin.engine.disk import DiskError, disk_failure
from gpustack_models.plugin.engine.failures import (
    CANCELED,
    INTEGRITY_MISMATCH,
    SOURCE_UNAVAILABLE,
    DownloadFailed,
    SourcePenalties,
)
from gpustack_models.plugin.engine.fetch import RangeFetcher
from gpustack_models.plugin.engine.frontier import HashFrontier
from gpustack_models.plugin.engine.limits import Limits
from gpustack_models.plugin.engine.peering import FanOutFactory
from gpustack_models.plugin.engine.publish import verify_and_publish
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.ticket import FetchTicket, ticket_files
from gpustack_models.plugin.engine.tree import PartialTree

__all__ = ["CHECKPOINT_VERSION", "Download", "DownloadSettings", "Limits"]

MiB = 1024 * 1024


def _new_stats() -> dict[str, int]:
    return {
        "requests": 0,  # HTTP requests for file bytes (redirect hops not counted)
        "network_bytes": 0,  # body bytes received
        "resumed_bytes": 0,  # bytes found on disk from an earlier attempt
        "resumed_hash_bytes": 0,  # of which hashed already: their hash state was restored
        "reread_bytes": 0,  # bytes read back from disk to hash them
        "linked_bytes": 0,  # bytes hard-linked from the node's Ready trees instead of fetched
        "retries": 0,
        "peer_bytes": 0,  # of network_bytes, those from peers
        "banned_peers": 0,  # peers banned for sending bad bytes
        "rechecked_bytes": 0,  # of network_bytes, those read again to find whose bytes a file failed with
    }


@dataclass
class DownloadSettings:
    """Tuning of the downloader (defaults suit a GPU node on a fast link)."""

    split_threshold: int = 64 * MiB  # files at least this big are fetched as parallel ranges
    part_size: int = 16 * MiB  # size of one range of a split file
    buffer_size: int = 1 * MiB  # bytes read from the socket per call
    stall_timeout: float = 30.0  # seconds without a byte before a range is retried
    range_retries: int = 5  # retries of one range after stalls or dropped connections
    http_retries: int = 2  # retries of one range after a 5xx/429 answer, before failing
    http_retry_max_wait: float = 10.0  # a longer Retry-After fails at once (the backoff honours it)
    checkpoint_interval: float = 5.0  # seconds between checkpoints of a running download
    durable: bool = True  # fdatasync data before a checkpoint claims it and before publishing
    max_threads: int = 32  # threads per download (the node-wide slots bound real parallelism)

    def __post_init__(self):
        if self.part_size < 64 * 1024 or self.buffer_size < 4096 or self.split_threshold < 1:
            raise ValueError("part_size >= 64 KiB, buffer_size >= 4 KiB and split_threshold >= 1 are required")


@dataclass(eq=False)
class Part:
    """``[start, end)`` of ``f`` for one request; ``end`` may move down while it is read (its tail taken by an
    idle thread), under ``lock``; ``claim`` is how far the read under way reaches (``fetch`` keeps it)."""

    f: FileProgress
    start: int
    end: int
    claim: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Parts:
    """2. The missing bytes of a download's files as parts, handed out in file order to its threads; once
    none is left, a thread asking for one takes the second half of the part in flight with the most left
    (at least ``2 * STEAL_MIN`` bytes, of a file big enough to be split), so no connection sits idle while
    another reads a long tail. A file under ``split_threshold`` stays one request."""

    STEAL_MIN = 1 * MiB
    GRAIN = 64 * 1024

    def __init__(self, settings: DownloadSettings):
        self._settings = settings
        self._parts: deque[Part] = deque()
        self._inflight: set[Part] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._parts)

    def plan(self, files: list[FileProgress]) -> None:
        settings = self._settings
        for f in files:
            if f.verified or f.complete:
                continue
            for start, end in f.missing():
                if f.size >= settings.split_threshold:
                    for s in range(start, end, settings.part_size):
                        self._parts.append(Part(f, s, min(end, s + settings.part_size), s))
                else:
                    self._parts.append(Part(f, start, end, start))

    def take(self) -> Part | None:
        """The next part, or the tail of the longest one in flight; ``None`` once nothing is worth taking."""
        with self._lock:
            part = self._parts.popleft() if self._parts else self._steal()
            if part is not None:
                self._inflight.add(part)
            return part

    def done(self, part: Part) -> None:
        with self._lock:
            self._inflight.discard(part)

    def _steal(self) -> Part | None:
        """Caller holds ``_lock``."""
        best, cut, most = None, 0, 2 * self.STEAL_MIN - 1
        for part in self._inflight:
            if part.f.size < self._settings.split_threshold:  # a file fetched whole stays one request
                continue
            with part.lock:
                reach = max(part.start, part.claim)
                if part.end - reach > most:
                    best, most = part, part.end - reach
                    cut = reach + (most // 2) // self.GRAIN * self.GRAIN
        if best is None:
            return None
        with best.lock:
            if cut < max(best.start, best.claim) or best.end - cut < self.STEAL_MIN:
                return None  # its read moved on meanwhile: the next ask looks again
            tail, best.end = Part(best.f, cut, best.end, cut), cut
        return tail


class Download:
    """Fetch, verify and publish one ticket's digest into ``cache``.

    ``prepare()`` then ``run()`` (``run`` prepares itself if needed). ``cancel()`` may be called from
    any thread. ``downloaded_bytes`` (bytes written and hashed so far), ``size`` and
    ``remaining_bytes`` (not yet on disk) are cheap to read at any time. ``penalties``: the sources
    that failed lately on the node, shared by its downloads (the download's own when not given).
    ``fan_out`` (``peering``): with it, the ticket's peers are asked too, through the fan-out it builds
    for this download, ``on_peer_bytes(node, n)`` hearing of the bytes each sends. ``layers_first``: files inside
    compressed layers of a registry are read out of their layers even when a peer holds them (``layers``).
    """

    def __init__(
        self,
        ticket: FetchTicket,
        cache: Cache,
        limits: Limits | None = None,
        settings: DownloadSettings | None = None,
        *,
        on_bytes: Callable[[int], None] | None = None,
        penalties: SourcePenalties | None = None,
        fan_out: FanOutFactory | None = None,
        on_peer_bytes: Callable[[str, int], None] | None = None,
        layers_first: bool = False,
    ):
        self.ticket = ticket
        self.digest = ticket.digest
        self.cache = cache
        self.limits = limits or Limits()
        self.settings = settings or DownloadSettings()
        self.size = sum(f.size for f in ticket.files)
        self._prepared = False
        self._stop = threading.Event()
        self._failure: DownloadFailed | None = None
        self._failure_lock = threading.Lock()
        self._progress_lock = threading.Lock()
        self._downloaded = 0
        self._events = threading.Condition()
        self._parts = Parts(self.settings)
        self._stats_lock = threading.Lock()
        self.stats = _new_stats()
        self._frontier = HashFrontier(
            on_hashed=self._add_progress, on_reread=self._count_reread, on_complete=self._wake_coordinator
        )
        self._fetcher = RangeFetcher(
            ticket, self.settings, self.limits.rate, self._frontier, self._stop, self._stat, on_bytes, penalties
        )
        self._tree = PartialTree(
            cache, self.digest, self._frontier, durable=self.settings.durable, on_failure=self._fail
        )
        self._files = self._tree.files  # the tree's list, filled by ``prepare``
        self.fanout = fan_out(ticket, self, on_peer_bytes) if fan_out is not None else None
        self._layers_first = layers_first

    # ---------------------------------------------------------------- progress (any thread)

    @property
    def downloaded_bytes(self) -> int:
        return self._downloaded

    @property
    def linked_bytes(self) -> int:
        """Bytes hard-linked from the node's Ready trees (held by those trees too)."""
        return self.stats["linked_bytes"]

    @property
    def remaining_bytes(self) -> int:
        """Bytes not yet on disk (what a capacity reservation must still hold)."""
        if not self._prepared:
            return self.size
        return max(0, self.size - self._tree.on_disk_bytes())

    def written(self) -> list[tuple[str, int, list[list[int]]]]:
        """Read-only, from any thread (what peers are told this node has): per manifest file, in manifest
        order, its path, size and the half-open byte ranges on disk so far (the whole file once hashed and
        matched; ``[]`` for an empty file). ``[]`` before ``prepare``."""
        return self._tree.written() if self._prepared else []

    def _stat(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[name] += n

    def _count_reread(self, n: int) -> None:
        self._stat("reread_bytes", n)

    def _add_progress(self, n: int) -> None:
        with self._progress_lock:
            self._downloaded += n

    def _wake_coordinator(self) -> None:
        with self._events:
            self._events.notify_all()

    # ---------------------------------------------------------------- control

    def cancel(self, message: str = "cancelled") -> None:
        self._fail(DownloadFailed(CANCELED, message))

    @property
    def cancelled(self) -> bool:
        return self._stop.is_set()

    def _fail(self, failure: DownloadFailed) -> None:
        with self._failure_lock:
            if self._failure is None:
                self._failure = failure
        self._stop.set()
        self._fetcher.abort()
        if self.fanout is not None:
            self.fanout.abort()
        self._wake_coordinator()

    # ---------------------------------------------------------------- 1. prepare

    def prepare(self) -> None:
        """Validate the ticket, read the checkpoint, and work out what is left to fetch."""
        if self._prepared:
            return
        self.ticket.validate()
        self._tree.open(ticket_files(self.ticket.files), self.stats)
        self._downloaded = sum(f.size if f.verified else f.hashed for f in self._files)
        self._prepared = True

    # ---------------------------------------------------------------- run

    def run(self) -> Path:
        """Download what is missing, verify, publish; return the published tree's path."""
        try:
            self.prepare()
        except (DiskError, OSError) as exc:
            raise disk_failure(exc) from None
        if self.cache.published(self.digest):
            return self.cache.tree(self.digest)
        self._fetch_missing()
        if self._failure is None:
            tree = self._publish()
            if tree is not None:
                return tree
        self._wind_down()
        raise self._failure

    @property
    def source_bytes(self) -> dict[str, int]:
        """Bytes received so far by source: ``hub`` and each peer's node."""
        peers = self.fanout.peer_bytes() if self.fanout is not None else {}
        return {"hub": max(0, self.stats["network_bytes"] - sum(peers.values())), **peers}

    def _fetch_missing(self) -> None:
        """Fetch every missing part with the fetching threads, until all are in or the download failed."""
        self._fetcher.open()
        threads: list[threading.Thread] = []
        try:
            for f in self._files:
                if not f.verified:
                    self._frontier.advance(f)  # resumed bytes written past the saved frontier; empty files
            packed = layers.plan(self.ticket, self._files, self.fanout is not None and not self._layers_first)
            inside = {id(f) for layer in packed for _, group in layer.groups for f in group}
            rest = [f for f in self._files if id(f) not in inside]
            if self.fanout is not None:
                count = self.fanout.open(rest)
            else:
                self._parts.plan(rest)
                count = len(self._parts)
            self._start_threads(threads, count)
            self._start_threads(threads, len(packed), packed)
            self._coordinate(threads)
            while self.fanout is not None and self.fanout.unfinished() and not self._stop.is_set():
                self._start_threads(threads, self.settings.max_threads)  # a file was thrown away at the end
                self._coordinate(threads)
        except DownloadFailed as exc:
            self._fail(exc)
        except (DiskError, OSError) as exc:
            self._fail(disk_failure(exc))
        finally:
            self._stop_threads(threads)
            if self.fanout is not None:
                self.fanout.close()
            self._fetcher.close()

    def _publish(self) -> Path | None:
        """7. Verify and publish the tree; ``None`` once the failure is recorded."""
        try:
            return verify_and_publish(self.cache, self.digest, self._files, durable=self.settings.durable)
        except DownloadFailed as exc:
            self._fail(exc)
        except (DiskError, OSError) as exc:
            self._fail(disk_failure(exc))
        return None

    # ---------------------------------------------------------------- 3. the fetching threads

    def _start_threads(self, threads: list[threading.Thread], count: int, packed: list | None = None) -> None:
        """One thread per part, at most ``max_threads`` (or one per compressed layer of ``packed``), each
        appended to ``threads`` once started."""
        for i in range(min(count, self.settings.max_threads)):
            layer = packed[i] if packed else None
            name = f"{'layer' if layer else 'download'}-{self.ticket.hex[:8]}-{i}"
            thread = threading.Thread(target=self._fetching, args=(layer,), name=name, daemon=True)
            thread.start()
            threads.append(thread)

    def _stop_threads(self, threads: list[threading.Thread]) -> None:
        if self._failure is not None:
            self._stop.set()
        for thread in threads:
            thread.join()

    def _fetching(self, layer: layers.Layer | None = None) -> None:
        """One fetching thread: parts (or the fan-out's segments, or a compressed layer's files) into its own
        buffer, until none is left."""
        view = memoryview(bytearray(self.settings.buffer_size))
        try:
            if layer is not None:
                layers.LayerStream(self._fetcher, self._frontier, layer, self._stop).run(view, self.limits.slots)
            elif self.fanout is not None:
                self.fanout.work(view)
            else:
                self._fetch_parts(view)
        except DownloadFailed as exc:
            self._fail(exc)
        except (DiskError, OSError) as exc:
            self._fail(disk_failure(exc))
        except Exception as exc:  # a bug must not leave the download hanging
            self._fail(DownloadFailed(SOURCE_UNAVAILABLE, f"unexpected error: {type(exc).__name__}: {exc}"))
        finally:
            self._wake_coordinator()

    def _fetch_parts(self, view: memoryview) -> None:
        """Take a connection slot, then a part, and fetch it; until no part is left or the download stops."""
        slots = self.limits.slots
        while not self._stop.is_set():
            if not slots.acquire(self._stop.is_set):
                return
            try:
                part = self._parts.take()
                if part is None:
                    return
                try:
                    self._fetcher.fetch(part.f, part.start, part.end, view, part)
                finally:
                    self._parts.done(part)
            finally:
                slots.release()

    # ---------------------------------------------------------------- 5. the coordinator and checkpoints

    def _coordinate(self, threads: list[threading.Thread]) -> None:
        """Close finished files, write checkpoints, until the fetching threads are done or something failed.

        Finished files are made durable by a few syncing threads, so flushing to disk overlaps the
        download instead of trailing it (a file counts as verified once it is on disk)."""
        interval = self.settings.checkpoint_interval
        last = time.monotonic()
        syncer = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sync") if self.settings.durable else None
        try:
            while not self._stop.is_set():
                alive = any(t.is_alive() for t in threads)
                self._tree.close_completed(syncer)
                if not alive:
                    break
                with self._events:
                    self._events.wait(timeout=min(0.2, interval))
                if time.monotonic() - last >= interval:
                    self._checkpoint_recovering()
                    last = time.monotonic()
        finally:
            if syncer is not None:
                syncer.shutdown(wait=True)
        self._tree.close_completed(None)

    def _checkpoint_recovering(self) -> None:
        """A checkpoint; a file found bad while hashing for it is fetched again if peers wrote to it."""
        try:
            self.checkpoint()
        except DownloadFailed as exc:
            if self.fanout is None or not self.fanout.recover(exc):
                raise

    def checkpoint(self, *, sync: bool | None = None, advance: bool = True) -> None:
        """Make written bytes durable, then atomically save every file's progress."""
        if not self._prepared:
            return
        self._tree.checkpoint(sync=self.settings.durable if sync is None else sync, advance=advance)

    # ---------------------------------------------------------------- after a failure

    def _wind_down(self) -> None:
        """After a failure: discard files that failed verification, save progress for a later attempt."""
        mismatch = self._failure is not None and self._failure.reason == INTEGRITY_MISMATCH
        self._tree.set_aside(mismatch=mismatch)
        try:
            self.checkpoint(sync=False, advance=False)
        except (OSError, DiskError, DownloadFailed):
            pass
