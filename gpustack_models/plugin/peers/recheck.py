"""Finding the peer whose bytes fail: a file that failed its hash, re-checked range by range.

The manifest hashes whole files, so a file that fails its hash says only that some byte of it is bad,
not whose. Banning every peer that wrote to it would let one lying peer (or one honest node's flipped
byte on disk) get every honest peer that served the same file banned. Instead, ``Recheck`` reads each
range a peer wrote (``FileProgress.writers``, cut at the segment size) once more from a second source,
compares it with what the file holds, and writes the second source's bytes where they differ:

- the second source is the ticket's hubs (the manifest's origin), in their failover order; a range no
  hub serves (every hub failed it) is read from another usable peer holding it, never from its writer
  nor from a peer whose bytes already differed;
- the file is then hashed once more from disk (``HashFrontier.rehash``). Only that hash decides: if it
  matches, the peers whose bytes differed from it sent bad bytes, and only they are banned; a second
  source that lied can cost a re-check, never an honest peer its place.

Bounded: the ranges read again are those peers wrote, each once, so a file's re-check fetches at most
its size once more. The re-check gives up (``Inconclusive``, saying why; the fan-out then throws the
file away and bans every peer that wrote to it, as without a re-check) when a range has no second
source that serves it, when no byte differed, or when the file still fails its hash.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.frontier import HashFrontier
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.peers.peer_client import PeerBusy, PeerClient, PeerError, PeerMissing
from gpustack_models.plugin.peers.swarm import Board


class Inconclusive(Exception):
    """The re-check could not tell which peer sent the bad bytes (the message says why)."""


def pieces(ranges: list[list[int]], size: int) -> list[tuple[int, int]]:
    """``ranges`` cut at every multiple of ``size`` (a segment's bytes come from one second source)."""
    out = []
    for start, end in ranges:
        while start < end:
            cut = min(end, (start // size + 1) * size)
            out.append((start, cut))
            start = cut
    return out


class Compare:
    """A sink for a second source's bytes of ``f``: each chunk is compared with the file's bytes at its
    offset and written over them where they differ (``differs``); ``pos`` follows the bytes compared."""

    def __init__(self, f: FileProgress, fd: int, scratch: bytearray, start: int):
        self.f, self.fd, self.scratch = f, fd, scratch
        self.pos, self.differs = start, False

    def __call__(self, chunk: memoryview, pos: int) -> None:
        n = len(chunk)
        mine = memoryview(self.scratch)[:n]
        held = 0
        while held < n:
            got = disk.read_at(self.fd, mine[held:], pos + held)
            if got <= 0:
                break
            held += got
        if held < n or mine != chunk:
            disk.write_at(self.fd, chunk, pos)
            self.differs = True
        self.pos = pos + n


class Recheck:
    """The re-check of one download's bad files (see the module's docstring). ``hub(f, start, end, view,
    sink)`` reads bytes from the ticket's hubs (raising ``DownloadFailed`` when every hub failed);
    ``count(node, n)`` hears of the bytes each peer sent; ``stopped()``: the download is over."""

    def __init__(
        self,
        board: Board,
        client: PeerClient,
        frontier: HashFrontier,
        hub: Callable[..., None],
        count: Callable[[str, int], None],
        stopped: Callable[[], bool],
    ):
        self.board, self.client, self.frontier = board, client, frontier
        self._hub, self._count, self._stopped = hub, count, stopped
        self.bytes = 0  # read again so far, by every re-check of the download

    def run(self, f: FileProgress, view: memoryview) -> set[str]:
        """Re-check ``f`` (bad, every byte written): the peers whose bytes differed from the file that
        now matches the manifest (complete); raises ``Inconclusive``."""
        with f.lock:
            writers = {node: [list(r) for r in ranges] for node, ranges in f.writers.items()}
        fd, scratch = f.open(), bytearray(len(view))
        differ: set[str] = set()
        for node, ranges in sorted(writers.items()):
            for start, end in pieces(ranges, self.board.size):
                compare = Compare(f, fd, scratch, start)
                self._from_second_source(f, node, compare, end, view, exclude={node} | differ)
                if compare.differs:
                    differ.add(node)
        if not differ:
            raise Inconclusive("no byte the peers wrote differs from a second source")
        try:
            self.frontier.rehash(f)
        except DownloadFailed:
            raise Inconclusive("it still fails its hash with the bytes that differed replaced") from None
        return differ

    def _from_second_source(
        self, f: FileProgress, node: str, compare: Compare, end: int, view: memoryview, exclude: set[str]
    ) -> None:
        """Compare ``[compare.pos, end)``, written by ``node``, with the hubs' bytes, or a peer's where no
        hub serves them."""
        start = compare.pos
        try:
            self._hub(f, compare.pos, end, view, compare)
        except DownloadFailed as exc:
            hub_failure = exc
        else:
            hub_failure = None
        self.bytes += compare.pos - start
        for holder in self.board.holders(f.file.path, compare.pos, end, exclude) if compare.pos < end else ():
            self._from_peer(holder, f, compare, end, view)
            if compare.pos >= end:
                break
        if self._stopped():
            raise Inconclusive("the download stopped")
        if compare.pos < end:
            why = f": {hub_failure}" if hub_failure is not None else ""
            raise Inconclusive(f"no second source served bytes {compare.pos}-{end - 1} written by {node}{why}")

    def _from_peer(self, holder, f: FileProgress, compare: Compare, end: int, view: memoryview) -> None:
        """Compare what ``holder`` sends of ``[compare.pos, end)``; a peer failing is counted against it."""
        start, began = compare.pos, time.monotonic()
        try:
            self.client.read(holder.peer, f, start, end, view, compare, self._stopped)
        except PeerBusy:
            pass
        except PeerMissing:
            self.board.forget(holder.node, f.file.path)
        except PeerError:
            self.board.peer_failed(holder.node)
        moved = compare.pos - start
        self.bytes += moved
        self.board.received(holder.node, moved, time.monotonic() - began)
        self._count(holder.node, moved)
