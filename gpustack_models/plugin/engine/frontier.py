"""Hashing while writing: each file's hash frontier moves over its contiguous written bytes.

The thread that wrote the bytes at a file's frontier hashes them from its own buffer; bytes that
arrived ahead of the frontier (other parts of the file) are read back from disk when the frontier
reaches them. Once the frontier reaches the file's size, the digest is compared with the
manifest's: a match marks the file complete, a mismatch fails the download with
``IntegrityMismatch`` and marks the file bad (its data is discarded, or, when peers wrote to it, its
peers' ranges are re-checked against a second source and the file hashed once more: ``rehash``). A bad
file is hashed no further until then.
"""

from __future__ import annotations

from collections.abc import Callable

from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.failures import INTEGRITY_MISMATCH, DownloadFailed
from gpustack_models.plugin.engine.hashing import FileHash
from gpustack_models.plugin.engine.ranges import FileProgress

MiB = 1024 * 1024
_MIN_READ = 64 * 1024  # the smallest buffer for reading written bytes back
_MAX_READ = 4 * MiB  # the largest


class HashFrontier:
    """Moves the hash frontier of a download's files.

    ``on_hashed(n)``: ``n`` more bytes were hashed; ``on_reread(n)``: of which ``n`` were read
    back from disk; ``on_complete()``: a file was hashed to its end and matched the manifest.
    """

    def __init__(
        self,
        *,
        on_hashed: Callable[[int], None],
        on_reread: Callable[[int], None],
        on_complete: Callable[[], None],
    ):
        self._on_hashed = on_hashed
        self._on_reread = on_reread
        self._on_complete = on_complete

    def record(self, f: FileProgress, start: int, end: int, chunk: memoryview | None) -> None:
        """``[start, end)`` of ``f`` was written (``chunk`` holds those bytes, if at hand): note it,
        and hash what it makes contiguous."""
        with f.lock:
            f.add_range(start, end)
            f.dirty = True
        self.advance(f, start, chunk)

    def advance(self, f: FileProgress, start: int = -1, chunk: memoryview | None = None) -> None:
        """Move ``f``'s hash frontier over every contiguous written byte. Only one thread hashes a
        file at a time; the others return at once, and whoever holds the hash lock re-checks after
        releasing it, so no written byte is left behind."""
        while f.hash_lock.acquire(blocking=False):
            try:
                self._hash_available(f, start, chunk)
                chunk = None
            finally:
                f.hash_lock.release()
            if not f.hash_pending() or f.complete:
                return

    def _hash_available(self, f: FileProgress, start: int, chunk: memoryview | None) -> None:
        """Hash from the frontier to the end of its written run (caller holds ``f.hash_lock``)."""
        if f.complete or f.verified or f.bad:
            return
        scratch: bytearray | None = None
        while True:
            with f.lock:
                frontier = f.hashed
                reach = f.covered_end(frontier)
            if reach == frontier:
                break
            if chunk is not None and start == frontier:
                f.hasher.update(chunk)
                step, chunk = len(chunk), None
            else:
                if scratch is None:
                    scratch = bytearray(min(_MAX_READ, max(_MIN_READ, reach - frontier)))
                step = self._hash_from_disk(f, frontier, reach, scratch)
            with f.lock:
                f.hashed = frontier + step
                f.dirty = True
            self._on_hashed(step)
        if frontier == f.size:
            self._finalize(f)

    def _hash_from_disk(self, f: FileProgress, frontier: int, reach: int, scratch: bytearray) -> int:
        """Hash written bytes from ``frontier`` on, read back from the file; how many were hashed."""
        view = memoryview(scratch)[: min(len(scratch), reach - frontier)]
        got = disk.read_at(f.open(), view, frontier)
        if got <= 0:
            raise DownloadFailed(INTEGRITY_MISMATCH, f"{f.file.path}: written bytes vanished at {frontier}")
        f.hasher.update(view[:got])
        self._on_reread(got)
        return got

    def rehash(self, f: FileProgress) -> None:
        """Hash ``f`` once more from its first byte, read back from disk (a bad file whose bytes were
        replaced): complete if it matches the manifest now; raises ``DownloadFailed`` (the file stays bad)
        if not. Every byte must be written."""
        with f.hash_lock:
            hasher, pos = FileHash(f.file.algorithm, f.size), 0
            view = memoryview(bytearray(min(_MAX_READ, max(_MIN_READ, f.size))))
            fd = f.open()
            while pos < f.size:
                got = disk.read_at(fd, view[: min(len(view), f.size - pos)], pos)
                if got <= 0:
                    raise DownloadFailed(INTEGRITY_MISMATCH, f"{f.file.path}: written bytes vanished at {pos}")
                hasher.update(view[:got])
                pos += got
            self._on_reread(pos)
            with f.lock:
                f.hasher, f.hashed, f.bad, f.dirty = hasher, f.size, False, True
            self._finalize(f)

    def _finalize(self, f: FileProgress) -> None:
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
        self._on_complete()
