"""The resumable, verifying range downloader: one ``Download`` per manifest digest.

How a digest is fetched:

1. ``prepare()`` reads the checkpoint of earlier attempts (``partial/<hex>/checkpoint.json``) and
   works out what is missing: files already verified are not touched again; for the others, the
   byte ranges already written and the hash state of their contiguous hashed prefix are restored.
2. The missing bytes become *parts*: a small file is one part (one request); a file of at least
   ``split_threshold`` bytes is cut into ``part_size`` pieces fetched in parallel. Parts are handed
   out in file order, so the bytes of a file arrive roughly in order.
3. Worker threads take a node-wide connection slot, then the next part, and fetch it with an HTTP
   ``Range`` request, reading straight into a reusable buffer and writing it with ``pwrite`` at its
   offset. Every read first takes its bytes from the node-wide rate limiter. A read that stalls
   (no byte for ``stall_timeout``) or a connection that drops is retried from the part's last
   written byte, at most ``range_retries`` times.
4. Each file is hashed while it is written: the thread that wrote the bytes at the file's hash
   frontier hashes them from its buffer; bytes that arrived ahead of the frontier (other parts) are
   hashed from disk when the frontier reaches them. The hash is sha256 (LFS and ModelScope files)
   or the git blob sha1, computed by ``hashing.FileHash`` whose state can be saved.
5. Every ``checkpoint_interval`` seconds the coordinator makes the written bytes durable
   (``fdatasync``) and then replaces the checkpoint with, per file, the written ranges, the hash
   frontier and the hash state at that frontier. After ``kill -9`` a new process resumes from there:
   it requests only the ranges not in the checkpoint and does not read the hashed prefix again.
6. When a file's frontier reaches its size, its digest is compared with the manifest's; a mismatch
   fails the download with ``IntegrityMismatch`` and that file's partial data is discarded.
7. After all files: each file's size and hash are checked once more against the manifest, the
   manifest digest is recomputed from the verified files and compared with the ticket's, the files
   are made durable, and the tree is published with one ``rename``. An unverified tree is never
   published.

Failures raise ``DownloadFailed`` with one of the node's reasons (see ``failures``).
"""

from __future__ import annotations

import bisect
import errno
import http.client
import os
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpustack_models.sources.manifest import ManifestFile, manifest_digest

from .cache import Cache, atomic_write_json, fsync_dir, read_json
from .failures import (
    ACCESS_DENIED,
    CANCELED,
    INSUFFICIENT_CAPACITY,
    INTEGRITY_MISMATCH,
    INVALID_REQUEST,
    SOURCE_UNAVAILABLE,
    DownloadFailed,
)
from .hashing import FileHash
from .limits import ConnectionSlots, RateLimiter
from .ticket import FetchTicket, origin, ticket_files
from .transport import ConnectionPool, HttpError, Response

MiB = 1024 * 1024
CHECKPOINT_VERSION = 1
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


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
    max_workers: int = 32  # threads per download (the node-wide slots bound real parallelism)

    def __post_init__(self):
        if self.part_size < 64 * 1024 or self.buffer_size < 4096 or self.split_threshold < 1:
            raise ValueError("part_size >= 64 KiB, buffer_size >= 4 KiB and split_threshold >= 1 are required")


class Limits:
    """The node-wide connection slots and rate limiter, shared by every download of the node."""

    def __init__(self, concurrency: int = 8, bytes_per_second: int = 0):
        self.slots = ConnectionSlots(concurrency)
        self.rate = RateLimiter(bytes_per_second)

    def set(self, concurrency: int | None = None, bytes_per_second: int | None = None) -> None:
        if concurrency is not None:
            self.slots.set_limit(concurrency)
        if bytes_per_second is not None:
            self.rate.set_rate(bytes_per_second)


class _Retry(Exception):
    """A range attempt failed in a way worth retrying from the last written byte (``pos``)."""

    def __init__(self, message: str, pos: int | None = None):
        super().__init__(message)
        self.pos = pos


class _HubStatus(Exception):
    """The hub answered a status worth retrying a few times (5xx, 429)."""

    def __init__(self, message: str, retry_after: float | None):
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(response: Response) -> float | None:
    value = response.header("Retry-After")
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _where(url: str) -> str:
    """A URL for messages: the origin only. Messages end up in the node's status, which must not
    name a repository; signed CDN links also carry signatures in their query."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class _File:
    """One file's progress: the byte ranges written, the hash frontier and its hash."""

    def __init__(self, file: ManifestFile, path: Path):
        self.file = file
        self.path = path
        self.size = file.size
        self.lock = threading.Lock()  # written, hashed, fd
        self.hash_lock = threading.Lock()  # the hasher and the frontier move under it
        self.starts: list[int] = []  # written ranges: sorted, disjoint, non-adjacent [start, end)
        self.ends: list[int] = []
        self.hashed = 0
        self.hasher: FileHash | None = None
        self.verified = False
        self.hexdigest: str | None = None
        self.complete = False  # hashed to the end and matching: waits for the coordinator to close
        self.fd: int | None = None
        self.url: str | None = None  # where a redirect led last time (the CDN), reused by later parts
        self.dirty = False
        self.bad = False  # failed verification: its data is discarded
        self.closing = False  # complete, being synced and closed

    # ---------------------------------------------------------------- written ranges

    def add_range(self, start: int, end: int) -> None:
        """Record ``[start, end)`` as written (caller holds ``lock``)."""
        starts, ends = self.starts, self.ends
        i = bisect.bisect_left(ends, start)  # first range that ends at or after start
        j = bisect.bisect_right(starts, end)  # ranges from i to j-1 touch [start, end)
        if i < j:
            start = min(start, starts[i])
            end = max(end, ends[j - 1])
        starts[i:j] = [start]
        ends[i:j] = [end]

    def covered_end(self, pos: int) -> int:
        """End of the written range containing ``pos``, or ``pos`` if none does (caller holds ``lock``)."""
        i = bisect.bisect_right(self.starts, pos) - 1
        if i >= 0 and self.ends[i] > pos:
            return self.ends[i]
        return pos

    def written_bytes(self) -> int:
        with self.lock:
            return sum(e - s for s, e in zip(self.starts, self.ends))

    def missing(self) -> list[tuple[int, int]]:
        """The ranges not written yet."""
        out, pos = [], 0
        with self.lock:
            for s, e in zip(self.starts, self.ends):
                if s > pos:
                    out.append((pos, s))
                pos = max(pos, e)
        if pos < self.size:
            out.append((pos, self.size))
        return out

    def open(self) -> int:
        with self.lock:
            if self.fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            return self.fd

    def close(self, sync: bool) -> None:
        with self.lock:
            fd, self.fd = self.fd, None
        if fd is not None:
            try:
                if sync:
                    os.fdatasync(fd)
            finally:
                os.close(fd)


class Download:
    """Fetch, verify and publish one ticket's digest into ``cache``.

    ``prepare()`` then ``run()`` (``run`` prepares itself if needed). ``cancel()`` may be called from
    any thread. ``downloaded_bytes`` (bytes written and hashed so far), ``size`` and
    ``remaining_bytes`` (not yet on disk) are cheap to read at any time.
    """

    def __init__(
        self,
        ticket: FetchTicket,
        cache: Cache,
        limits: Limits | None = None,
        settings: DownloadSettings | None = None,
        *,
        on_bytes: Callable[[int], None] | None = None,
    ):
        self.ticket = ticket
        self.digest = ticket.digest
        self.cache = cache
        self.limits = limits or Limits()
        self.settings = settings or DownloadSettings()
        self.size = sum(f.size for f in ticket.files)
        self._on_bytes = on_bytes
        self._files: list[_File] = []
        self._prepared = False
        self._stop = threading.Event()
        self._failure: DownloadFailed | None = None
        self._failure_lock = threading.Lock()
        self._active: set[Response] = set()
        self._active_lock = threading.Lock()
        self._progress_lock = threading.Lock()
        self._downloaded = 0
        self._events = threading.Condition()
        self._parts: deque = deque()
        self._parts_lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._hub_origin = origin(ticket.endpoint) if isinstance(ticket.endpoint, str) else None
        self._stats_lock = threading.Lock()
        self.stats = {
            "requests": 0,  # HTTP requests for file bytes (redirect hops not counted)
            "network_bytes": 0,  # body bytes received
            "resumed_bytes": 0,  # bytes found on disk from an earlier attempt
            "resumed_hash_bytes": 0,  # of which hashed already: their hash state was restored
            "reread_bytes": 0,  # bytes read back from disk to hash them
            "retries": 0,
        }

    # ---------------------------------------------------------------- progress (any thread)

    @property
    def downloaded_bytes(self) -> int:
        return self._downloaded

    @property
    def remaining_bytes(self) -> int:
        """Bytes not yet on disk (what a capacity reservation must still hold)."""
        if not self._prepared:
            return self.size
        return max(0, self.size - sum(f.size if f.verified else f.written_bytes() for f in self._files))

    def _stat(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[name] += n

    def _add_progress(self, n: int) -> None:
        with self._progress_lock:
            self._downloaded += n

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
        with self._active_lock:
            active = list(self._active)
        for response in active:
            response.abort()
        with self._events:
            self._events.notify_all()

    # ---------------------------------------------------------------- prepare

    def prepare(self) -> None:
        """Validate the ticket, read the checkpoint, and work out what is left to fetch."""
        if self._prepared:
            return
        self.ticket.validate()
        tree = self.cache.partial_tree(self.digest)
        tree.mkdir(parents=True, exist_ok=True)
        checkpoint = read_json(self.cache.checkpoint_path(self.digest))
        saved = {}
        if (
            isinstance(checkpoint, dict)
            and checkpoint.get("version") == CHECKPOINT_VERSION
            and (checkpoint.get("digest") == self.digest)
        ):
            saved = checkpoint.get("files") or {}
        downloaded = 0
        for mf in ticket_files(self.ticket.files):
            f = _File(mf, tree / mf.path)
            self._restore(f, saved.get(mf.path))
            self._files.append(f)
            downloaded += f.size if f.verified else f.hashed
            self.stats["resumed_bytes"] += f.size if f.verified else f.written_bytes()
            self.stats["resumed_hash_bytes"] += f.size if f.verified else f.hashed
        self._downloaded = downloaded
        self._prepared = True

    def _restore(self, f: _File, entry) -> None:
        try:
            on_disk = os.stat(f.path).st_size
        except FileNotFoundError:
            on_disk = -1
        mf = f.file
        if isinstance(entry, dict) and entry.get("checksum") == mf.checksum and entry.get("size") == mf.size:
            if entry.get("verified") and on_disk == mf.size:
                f.verified, f.hexdigest = True, mf.hexdigest
                return
            ranges = entry.get("written") or []
            try:
                for start, end in ranges:
                    start, end = int(start), min(int(end), on_disk, mf.size)
                    if 0 <= start < end:
                        f.add_range(start, end)
            except (TypeError, ValueError):
                f.starts, f.ends = [], []
            hashed = entry.get("hashed")
            if isinstance(hashed, int) and 0 < hashed <= f.covered_end(0):
                hasher = FileHash.restore(mf.algorithm, mf.size, entry.get("hash"))
                if hasher is not None:
                    f.hasher, f.hashed = hasher, hashed
        if f.hasher is None:
            f.hasher = FileHash(mf.algorithm, mf.size)
            f.hashed = 0
        if mf.size == 0:
            f.open()
            with f.lock:
                f.dirty = True

    # ---------------------------------------------------------------- run

    def run(self) -> Path:
        """Download what is missing, verify, publish; return the published tree's path."""
        try:
            self.prepare()
        except DownloadFailed:
            raise
        except OSError as exc:
            raise self._local_error(exc) from None
        if self.cache.published(self.digest):
            return self.cache.tree(self.digest)
        settings = self.settings
        self._pool = ConnectionPool(
            proxy=self.ticket.proxy, ca_bundle=self.ticket.ca_bundle, timeout=settings.stall_timeout
        )
        workers: list[threading.Thread] = []
        try:
            for f in self._files:
                if not f.verified:
                    self._advance(f)  # resumed bytes written past the saved frontier; empty files
            self._plan()
            count = min(len(self._parts), settings.max_workers)
            for i in range(count):
                thread = threading.Thread(target=self._worker, name=f"download-{self.ticket.hex[:8]}-{i}", daemon=True)
                thread.start()
                workers.append(thread)
            self._coordinate(workers)
        except DownloadFailed as exc:
            self._fail(exc)
        except OSError as exc:
            self._fail(self._local_error(exc))
        finally:
            self._stop_workers(workers)
            self._pool.close()
        if self._failure is not None:
            self._wind_down()
            raise self._failure
        try:
            return self._finish()
        except DownloadFailed as exc:
            self._fail(exc)
            self._wind_down()
            raise self._failure from None
        except OSError as exc:
            self._fail(self._local_error(exc))
            self._wind_down()
            raise self._failure from None

    def _plan(self) -> None:
        settings = self.settings
        for f in self._files:
            if f.verified or f.complete:
                continue
            for start, end in f.missing():
                if f.size >= settings.split_threshold:
                    for s in range(start, end, settings.part_size):
                        self._parts.append((f, s, min(end, s + settings.part_size)))
                else:
                    self._parts.append((f, start, end))

    def _next_part(self):
        with self._parts_lock:
            return self._parts.popleft() if self._parts else None

    def _coordinate(self, workers: list[threading.Thread]) -> None:
        """Close finished files, write checkpoints, until the workers are done or something failed.

        Finished files are made durable by a few syncing threads, so flushing to disk overlaps the
        download instead of trailing it (a file counts as verified once it is on disk)."""
        interval = self.settings.checkpoint_interval
        last = time.monotonic()
        syncer = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sync") if self.settings.durable else None
        try:
            while not self._stop.is_set():
                alive = any(t.is_alive() for t in workers)
                self._close_completed(syncer)
                if not alive:
                    break
                with self._events:
                    self._events.wait(timeout=min(0.2, interval))
                if time.monotonic() - last >= interval:
                    self.checkpoint()
                    last = time.monotonic()
        finally:
            if syncer is not None:
                syncer.shutdown(wait=True)
        self._close_completed(None)

    def _stop_workers(self, workers: list[threading.Thread]) -> None:
        if self._failure is not None:
            self._stop.set()
        for thread in workers:
            thread.join()

    def _wind_down(self) -> None:
        """After a failure: discard files that failed verification, save progress for a later attempt."""
        failure = self._failure
        for f in self._files:
            bad = failure is not None and failure.reason == INTEGRITY_MISMATCH and f.bad
            try:
                f.close(sync=self.settings.durable and not bad)
            except OSError:
                pass
            if bad:
                with f.lock:
                    f.starts, f.ends, f.dirty = [], [], True
                f.hasher, f.hashed, f.complete = FileHash(f.file.algorithm, f.size), 0, False
                try:
                    os.unlink(f.path)
                except OSError:
                    pass
            elif f.complete:
                f.verified = True
        try:
            self.checkpoint(sync=False, advance=False)
        except (OSError, DownloadFailed):
            pass

    def _local_error(self, exc: OSError) -> DownloadFailed:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return DownloadFailed(INSUFFICIENT_CAPACITY, f"the cache volume is full: {exc}")
        return DownloadFailed(SOURCE_UNAVAILABLE, f"writing the cache failed: {type(exc).__name__}: {exc}")

    # ---------------------------------------------------------------- workers

    def _worker(self) -> None:
        slots = self.limits.slots
        buffer = bytearray(self.settings.buffer_size)
        view = memoryview(buffer)
        try:
            while not self._stop.is_set():
                if not slots.acquire(self._stop.is_set):
                    return
                try:
                    part = self._next_part()
                    if part is None:
                        return
                    self._fetch(*part, view)
                finally:
                    slots.release()
        except DownloadFailed as exc:
            self._fail(exc)
        except OSError as exc:
            self._fail(self._local_error(exc))
        except Exception as exc:  # a bug must not leave the download hanging
            self._fail(DownloadFailed(SOURCE_UNAVAILABLE, f"unexpected error: {type(exc).__name__}: {exc}"))
        finally:
            with self._events:
                self._events.notify_all()

    def _fetch(self, f: _File, start: int, end: int, view: memoryview) -> None:
        """Fetch ``[start, end)`` of ``f``, retrying stalls and drops from the last written byte."""
        settings = self.settings
        pos = start
        drops = 0
        statuses = 0
        while pos < end:
            if self._stop.is_set():
                return
            try:
                pos = self._attempt(f, pos, end, view)
            except _Retry as exc:
                if exc.pos is not None and exc.pos > pos:
                    pos = exc.pos
                drops += 1
                if drops > settings.range_retries:
                    raise DownloadFailed(
                        SOURCE_UNAVAILABLE, f"{f.file.path}: giving up after {drops} attempts: {exc}"
                    ) from None
                self._stat("retries")
                self._sleep(min(0.25 * 2 ** (drops - 1), 5.0))
            except _HubStatus as exc:
                statuses += 1
                wait = exc.retry_after if exc.retry_after is not None else min(2.0 ** (statuses - 1), 8.0)
                if statuses > settings.http_retries or wait > settings.http_retry_max_wait:
                    raise DownloadFailed(SOURCE_UNAVAILABLE, str(exc), retry_after=exc.retry_after) from None
                self._stat("retries")
                self._sleep(wait)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _open(self, f: _File, pos: int, end: int) -> Response:
        """A response for ``bytes=pos-(end-1)`` of ``f``, redirects followed, status checked."""
        ticket = self.ticket
        for attempt in (0, 1):
            cached = f.url if attempt == 0 else None
            url = cached or ticket.url(f.file)
            try:
                response = self._pool.get(
                    url,
                    credentials=ticket.hub_headers(),
                    credentials_origin=self._hub_origin,
                    headers={"Range": f"bytes={pos}-{end - 1}"},
                )
            except HttpError as exc:
                if not exc.retryable:
                    raise DownloadFailed(SOURCE_UNAVAILABLE, f"{f.file.path}: {exc}") from None
                raise _Retry(str(exc)) from None
            self._stat("requests")
            status = response.status
            if status in (200, 206):
                # Later parts go straight to where the redirect led (the CDN), not via the hub.
                f.url = response.url if origin(response.url) != self._hub_origin else None
                return response
            detail = self._error_detail(response)
            if status in (401, 403, 404, 410) and cached:
                f.url = None  # an expired or revoked CDN link: ask the hub again
                continue
            where = f"{f.file.path}: GET {_where(response.url)}"
            if status in (401, 403, 404, 410):
                raise DownloadFailed(ACCESS_DENIED, f"{where} answered HTTP {status}{detail}")
            if status == 416:
                f.bad = True
                raise DownloadFailed(
                    INTEGRITY_MISMATCH,
                    f"{where} refused bytes {pos}-{end - 1}: the hub's file is shorter than {f.size}",
                )
            if status == 429 or status >= 500:
                raise _HubStatus(f"{where} answered HTTP {status}{detail}", _retry_after(response))
            if status in (400, 422):
                raise DownloadFailed(INVALID_REQUEST, f"{where} answered HTTP {status}{detail}")
            raise DownloadFailed(SOURCE_UNAVAILABLE, f"{where} answered unexpected HTTP {status}{detail}")
        raise DownloadFailed(ACCESS_DENIED, f"{f.file.path}: the hub refused the download")

    @staticmethod
    def _error_detail(response: Response) -> str:
        # The hub's error code only: its free-text message may name the repository.
        code = response.header("X-Error-Code")
        response.drain_small()
        return f" ({code[:64]})" if code and code.isprintable() else ""

    def _attempt(self, f: _File, pos: int, end: int, view: memoryview) -> int:
        """One request for ``[pos, end)``; returns the position reached (``end`` on success)."""
        response = self._open(f, pos, end)
        with self._active_lock:
            self._active.add(response)
        reuse = False
        cursor = [pos]  # the first byte not written yet, kept current by _read_body
        try:
            skip = 0
            if response.status == 206:
                m = _CONTENT_RANGE.fullmatch((response.header("Content-Range") or "").strip())
                if m is None or int(m.group(1)) != pos:
                    raise _Retry(f"{f.file.path}: unexpected Content-Range {response.header('Content-Range')!r}")
                if m.group(3) != "*" and int(m.group(3)) != f.size:
                    f.bad = True
                    raise DownloadFailed(
                        INTEGRITY_MISMATCH,
                        f"{f.file.path}: the hub serves {m.group(3)} bytes, the manifest says {f.size}",
                    )
                stop = min(end, int(m.group(2)) + 1)
            else:  # 200: the whole file, the Range was ignored
                if response.length is not None and response.length != f.size:
                    f.bad = True
                    raise DownloadFailed(
                        INTEGRITY_MISMATCH,
                        f"{f.file.path}: the hub serves {response.length} bytes, the manifest says {f.size}",
                    )
                skip, stop = pos, end
            pos = self._read_body(f, response, cursor, stop, skip, view)
            reuse = pos == end and response.length == 0
            return pos
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, OSError) and getattr(exc, "_local", False):
                raise
            if self._stop.is_set():
                return cursor[0]
            kind = "stalled" if isinstance(exc, (socket.timeout, TimeoutError)) else "connection lost"
            raise _Retry(f"{f.file.path}: {kind} at byte {cursor[0]}: {type(exc).__name__}: {exc}", cursor[0]) from None
        finally:
            with self._active_lock:
                self._active.discard(response)
            response.close(reuse=reuse)

    def _read_body(self, f: _File, response: Response, cursor: list, stop: int, skip: int, view: memoryview) -> int:
        rate = self.limits.rate
        cancelled = self._stop.is_set
        size = len(view)
        while skip > 0:
            n = rate.chunk(min(size, skip))
            rate.acquire(n, cancelled)
            got = response.readinto(view[:n])
            if got <= 0:
                raise http.client.IncompleteRead(b"")
            skip -= got
        fd = f.open()
        pos = start = cursor[0]
        try:
            while pos < stop:
                if cancelled():
                    break
                n = rate.chunk(min(size, stop - pos))
                if not rate.acquire(n, cancelled):
                    break
                got = response.readinto(view[:n])
                if got <= 0:
                    raise http.client.IncompleteRead(b"", stop - pos)
                chunk = view[:got]
                self._write(fd, chunk, pos)
                self._record(f, pos, pos + got, chunk)
                pos += got
                cursor[0] = pos
        finally:
            moved = pos - start
            if moved:
                self._stat("network_bytes", moved)
                if self._on_bytes is not None:
                    self._on_bytes(moved)
        return pos

    @staticmethod
    def _write(fd: int, chunk: memoryview, pos: int) -> None:
        try:
            while chunk:
                written = os.pwrite(fd, chunk, pos)
                chunk = chunk[written:]
                pos += written
        except OSError as exc:
            exc._local = True  # a disk error, not a network one
            raise

    # ---------------------------------------------------------------- hashing

    def _record(self, f: _File, start: int, end: int, chunk: memoryview | None) -> None:
        with f.lock:
            f.add_range(start, end)
            f.dirty = True
        self._advance(f, start, chunk)

    def _advance(self, f: _File, start: int = -1, chunk: memoryview | None = None) -> None:
        """Move ``f``'s hash frontier over every contiguous written byte. Only one thread hashes a
        file at a time; the others return at once, and whoever holds the hash lock re-checks after
        releasing it, so no written byte is left behind."""
        while True:
            if not f.hash_lock.acquire(blocking=False):
                return
            try:
                self._hash_available(f, start, chunk)
                chunk = None
            finally:
                f.hash_lock.release()
            with f.lock:
                pending = f.covered_end(f.hashed) > f.hashed
            if not pending or f.complete:
                return

    def _hash_available(self, f: _File, start: int, chunk: memoryview | None) -> None:
        """Caller holds ``f.hash_lock``."""
        if f.complete or f.verified:
            return
        scratch = None
        while True:
            with f.lock:
                frontier = f.hashed
                reach = f.covered_end(frontier)
            if reach > frontier:
                if chunk is not None and start == frontier:
                    f.hasher.update(chunk)
                    step = len(chunk)
                    chunk = None
                else:
                    if scratch is None:
                        scratch = bytearray(min(4 * MiB, max(64 * 1024, reach - frontier)))
                    fd = f.open()
                    want = min(len(scratch), reach - frontier)
                    try:
                        got = os.preadv(fd, [memoryview(scratch)[:want]], frontier)
                    except OSError as exc:
                        exc._local = True
                        raise
                    if got <= 0:
                        raise DownloadFailed(INTEGRITY_MISMATCH, f"{f.file.path}: written bytes vanished at {frontier}")
                    f.hasher.update(memoryview(scratch)[:got])
                    step = got
                    self._stat("reread_bytes", got)
                with f.lock:
                    f.hashed = frontier + step
                    f.dirty = True
                self._add_progress(step)
                continue
            if frontier == f.size:
                self._finalize(f)
            return

    def _finalize(self, f: _File) -> None:
        """The whole file is hashed: compare with the manifest (caller holds ``f.hash_lock``)."""
        actual = f.hasher.hexdigest()
        if actual != f.file.hexdigest:
            f.bad = True
            raise DownloadFailed(
                INTEGRITY_MISMATCH,
                f"{f.file.path}: {f.file.algorithm} is {actual}, the manifest says {f.file.hexdigest}",
            )
        f.hexdigest = actual
        f.complete = True
        with self._events:
            self._events.notify_all()

    # ---------------------------------------------------------------- checkpoints

    def _close_completed(self, syncer: ThreadPoolExecutor | None) -> None:
        for f in self._files:
            if f.complete and not f.verified and not f.closing:
                f.closing = True
                if syncer is not None:
                    syncer.submit(self._close_verified, f)
                else:
                    self._close_verified(f)

    def _close_verified(self, f: _File) -> None:
        try:
            f.close(sync=self.settings.durable)
        except OSError as exc:
            f.closing = False
            self._fail(self._local_error(exc))
            return
        f.verified = True
        with f.lock:
            f.dirty = True

    def checkpoint(self, *, sync: bool | None = None, advance: bool = True) -> None:
        """Make written bytes durable, then atomically save every file's progress."""
        if not self._prepared:
            return
        sync = self.settings.durable if sync is None else sync
        files = {}
        dirty = False
        for f in self._files:
            if f.verified:
                files[f.file.path] = {"checksum": f.file.checksum, "size": f.size, "verified": True}
                dirty = dirty or f.dirty
                f.dirty = False
                continue
            if f.closing:  # complete: a syncing thread owns its descriptor; saved as hashed to the end
                sync_this = False
            else:
                sync_this = True
            with f.hash_lock, f.lock:
                entry = {
                    "checksum": f.file.checksum,
                    "size": f.size,
                    "written": [[s, e] for s, e in zip(f.starts, f.ends)],
                    "hashed": f.hashed,
                    "hash": f.hasher.state() if f.hashed else None,
                }
                was_dirty, f.dirty = f.dirty, False
                fd = f.fd
            dirty = dirty or was_dirty
            if was_dirty and sync and sync_this and fd is not None:
                try:
                    os.fdatasync(fd)
                except OSError:
                    pass  # closed meanwhile by the coordinator, which synced it
            files[f.file.path] = entry
            if advance:
                self._advance(f)  # bytes that arrived while the hash lock was held here
        if not dirty:
            return
        document = {"version": CHECKPOINT_VERSION, "digest": self.digest, "files": files}
        atomic_write_json(self.cache.checkpoint_path(self.digest), document)

    # ---------------------------------------------------------------- finish

    def _finish(self) -> Path:
        verified: list[ManifestFile] = []
        for f in self._files:
            if not f.verified:
                raise DownloadFailed(INTEGRITY_MISMATCH, f"{f.file.path}: not complete after the download")
            try:
                size = os.stat(f.path).st_size
            except FileNotFoundError:
                size = -1
            if size != f.size:
                f.bad = True
                raise DownloadFailed(
                    INTEGRITY_MISMATCH, f"{f.file.path}: {size} bytes on disk, the manifest says {f.size}"
                )
            mf = f.file
            verified.append(ManifestFile(mf.path, size, mf.algorithm, f.hexdigest or "", mf.lfs))
        actual = manifest_digest(verified)
        if actual != self.digest:
            raise DownloadFailed(INTEGRITY_MISMATCH, f"the verified files hash to {actual}, not {self.digest}")
        if self.settings.durable:
            self._sync_tree()
        return self.cache.publish(self.digest)

    def _sync_tree(self) -> None:
        """Directories' entries durable before the publishing rename (file data was synced on close)."""
        tree = self.cache.partial_tree(self.digest)
        directories = {tree}
        for f in self._files:
            parent = f.path.parent
            while parent != tree and parent not in directories:
                directories.add(parent)
                parent = parent.parent
        for directory in directories:
            fsync_dir(directory)
