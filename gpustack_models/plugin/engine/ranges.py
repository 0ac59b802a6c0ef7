"""One file's progress in a download: the byte ranges written, the hash frontier and its hash.

The written ranges are kept as two sorted lists of starts and ends (disjoint, non-adjacent
``[start, end)`` ranges), so recording a write, finding the end of the written run from a position
and listing what is still missing are a bisection or a walk over a handful of ranges.
"""

from __future__ import annotations

import bisect
import threading
from pathlib import Path

from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.hashing import FileHash
from gpustack_models.sources.manifest import ManifestFile


class FileProgress:
    """One manifest file being downloaded to ``path``.

    ``lock`` guards the written ranges, ``hashed`` and ``fd``; ``hash_lock`` is held by the one
    thread moving the hash frontier (``hasher`` and ``hashed`` move under both).
    """

    def __init__(self, file: ManifestFile, path: Path):
        self.file = file
        self.path = path
        self.size = file.size
        self.lock = threading.Lock()
        self.hash_lock = threading.Lock()
        self.starts: list[int] = []
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
        self.linked: tuple[int, int] | None = None  # (st_dev, st_ino) of a Ready tree's file linked here
        self.epoch = 0  # bumped when the file's bytes are thrown away to be fetched again
        self.peers: set[str] = set()  # the peers that wrote bytes of this epoch (caller holds ``lock``)
        # The ranges each of them wrote, ``[start, end]`` pairs in the order written (caller holds ``lock``):
        # a file that fails its hash is re-checked range by range against a second source.
        self.writers: dict[str, list[list[int]]] = {}

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

    def note_peer(self, node: str, start: int, end: int) -> None:
        """``node`` wrote ``[start, end)`` (caller holds ``lock``); a write continuing its last range extends it."""
        self.peers.add(node)
        ranges = self.writers.setdefault(node, [])
        if ranges and ranges[-1][1] == start:
            ranges[-1][1] = end
        else:
            ranges.append([start, end])

    def written_bytes(self) -> int:
        with self.lock:
            return sum(e - s for s, e in zip(self.starts, self.ends))

    def written_ranges(self) -> list[list[int]]:
        """The written ranges as ``[start, end]`` pairs (caller holds ``lock``)."""
        return [[s, e] for s, e in zip(self.starts, self.ends)]

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

    def hash_pending(self) -> bool:
        """True if written bytes wait at the hash frontier."""
        with self.lock:
            return self.covered_end(self.hashed) > self.hashed

    def mark_dirty(self) -> None:
        with self.lock:
            self.dirty = True

    def take_dirty(self) -> bool:
        """Whether the file changed since the last call (caller holds ``lock`` or owns the file)."""
        was_dirty, self.dirty = self.dirty, False
        return was_dirty

    def new_hash(self) -> None:
        """Start the hash over from the file's first byte."""
        self.hasher, self.hashed = FileHash(self.file.algorithm, self.size), 0

    def discard(self) -> None:
        """Forget everything written (the file failed verification); the caller deletes the data."""
        with self.lock:
            self.starts, self.ends, self.dirty = [], [], True
        self.new_hash()
        self.complete = False

    def refetch(self) -> None:
        """Throw away every byte written (a peer sent bad ones): a new epoch, nothing written, a fresh
        hash. Writers of the old epoch find out under ``lock`` and write nothing more."""
        with self.hash_lock, self.lock:
            self.epoch += 1
            self.starts, self.ends, self.dirty = [], [], True
            self.peers, self.writers = set(), {}
            self.hasher, self.hashed = FileHash(self.file.algorithm, self.size), 0
            self.complete = self.bad = False
            self.url = None

    # ---------------------------------------------------------------- the partial file

    def open(self) -> int:
        """The file's descriptor, opened (and the file created) on first use; raises ``DiskError``."""
        with self.lock:
            if self.fd is None:
                self.fd = disk.open_file(self.path)
            return self.fd

    def close(self, sync: bool) -> None:
        """Close the descriptor, if open, syncing its data first if ``sync``; raises ``DiskError``."""
        with self.lock:
            fd, self.fd = self.fd, None
        if fd is not None:
            disk.close_file(fd, sync=sync)
