"""Finding the peer whose bytes fail: a file that failed its hash, re-checked range by range.

The manifest hashes whole files, so a file that fails its hash says only that some byte of it is bad,
not whose. Banning every peer that wrote to it would let one lying peer (or one honest node's flipped
byte on disk) get every honest peer that served the same file banned. Instead, ``Recheck`` reads each
range a peer wrote (``FileProgress.writers``, cut at the segment size) once more from a second source,
compares it with what the file holds, and writes the second source's bytes where they differ:

- the second source is the ticket's hubs (the manifest's origin), in their failover order: where their
  bytes differ, the writer's are replaced;
- a range no hub serves (every hub failed it) is read from other usable peers holding it, never from its
  writer nor from a peer found lying already, and two of them must speak: a peer that agrees with the
  writer confirms it (read until the first byte that differs); one that does not is checked against a
  third, whose bytes are written where they differ, and the odd one out of the three is the suspect;
- the peers are taken in turn, those that wrote least first; after one whose bytes differed, the file
  is hashed once more from disk (``HashFrontier.rehash``). Only that hash decides: once it matches, the
  peers whose bytes differ from it (the writers whose bytes were replaced, the second sources outvoted)
  sent bad bytes, and only they are banned; the peers not checked yet wrote bytes of a file that
  verifies and are not read again. A second source that lied can cost a re-check, never an honest peer
  its place.

Bounded: a file's re-check reads at most its size once more (with the hubs serving, the ranges peers
wrote, each once; peers outvoted read a little more, within the same bound). It gives up
(``Inconclusive``, saying why; the fan-out then throws the file away and bans every peer that wrote to
it, as without a re-check) when a range has no second source that serves it (or no third when two
disagree), when the bound would be passed, when no byte differed, or when the file still fails its hash.
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


class Differs(Exception):
    """A peer's bytes differ from the file's: no need to read the rest to know it."""


class Compare:
    """A sink for a second source's bytes of ``f``: each chunk is compared with the file's bytes at its
    offset (``differs``) and, if ``write``, written over them where they differ; else the first chunk that
    differs ends the read (``Differs``). ``pos`` follows the bytes compared."""

    def __init__(self, fd: int, scratch: bytearray, start: int, *, write: bool):
        self.fd, self.scratch, self.write = fd, scratch, write  # ``write``: trusted more than the file
        self.pos, self.differs = start, False
        self.node = ""  # the peer that sent the bytes, if one did

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
            self.differs = True
            if not self.write:
                self.pos = pos + n
                raise Differs()
            disk.write_at(self.fd, chunk, pos)
        self.pos = pos + n


class Recheck:
    """The re-check of one download's bad files (see the module's docstring). ``hub(f, start, end, view,
    sink)`` reads bytes from the ticket's hubs (raising ``DownloadFailed`` when every hub failed);
    ``count(node, n)`` hears of the bytes each peer sent; ``stopped()``: the download is over. One file at
    a time (the caller's lock): ``run`` keeps the file's state on the instance."""

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
        self._budget = 0  # what the re-check under way may still read

    def run(self, f: FileProgress, view: memoryview) -> set[str]:
        """Re-check ``f`` (bad, every byte written): the peers whose bytes differ from the file that now
        matches the manifest (complete); raises ``Inconclusive``."""
        with f.lock:
            writers = {node: [list(r) for r in ranges] for node, ranges in f.writers.items()}
        # The ranges peers wrote, once; and a segment for each of them outvoted (see the module's docstring).
        budget = sum(e - s for ranges in writers.values() for s, e in ranges) + len(writers) * self.board.size
        self._fd, self._scratch, self._budget = f.open(), bytearray(len(view)), min(budget, 2 * f.size)
        bad: set[str] = set()
        # The peers that wrote least first; once the bytes that differed are replaced the file may verify,
        # and the peers not checked yet are not asked for again: their bytes are in a file that verifies.
        for node in sorted(writers, key=lambda n: (sum(e - s for s, e in writers[n]), n)):
            found: set[str] = set()
            for start, end in pieces(writers[node], self.board.size):
                found |= self._piece(f, node, start, end, view, bad | found)
            bad |= found
            if found and self._verifies(f):
                return bad
        if not bad:
            raise Inconclusive("no byte the peers wrote differs from a second source")
        raise Inconclusive("it still fails its hash with the bytes that differed replaced")

    def _verifies(self, f: FileProgress) -> bool:
        try:
            self.frontier.rehash(f)
        except DownloadFailed:
            return False
        return True

    def _piece(self, f: FileProgress, node: str, start: int, end: int, view: memoryview, bad: set[str]) -> set[str]:
        """Check ``[start, end)``, written by ``node``, against the hubs, or peers where no hub serves it:
        the peers found to differ (``bad``: those found so far)."""
        compare = Compare(self._fd, self._scratch, start, write=True)
        self._spend(end - start)
        try:
            self._hub(f, start, end, view, compare)
        except DownloadFailed as exc:
            hub_failure = f" (the hubs: {exc})"
        else:
            hub_failure = ""
        self.bytes += compare.pos - start
        self._budget += end - compare.pos  # given back: the peers below spend it
        if self._stopped():
            raise Inconclusive("the download stopped")
        if compare.pos >= end:
            return {node} if compare.differs else set()
        return self._by_peers(f, node, compare.pos, end, view, bad, hub_failure) | (
            {node} if compare.differs else set()
        )

    def _by_peers(
        self, f: FileProgress, node: str, start: int, end: int, view: memoryview, bad: set[str], why: str
    ) -> set[str]:
        """``[start, end)`` of ``node``'s bytes against two other peers (see the module's docstring); of a
        peer found lying already, one other peer's bytes replace them."""
        holders = iter(self.board.holders(f.file.path, start, end, {node} | bad))
        second = self._from_peers(holders, f, start, end, view, write=node in bad)
        if second is None:
            raise Inconclusive(f"no second source served bytes {start}-{end - 1} written by {node}{why}")
        if second.write:  # ``node`` lied already: its bytes are replaced where they differ
            return {node} if second.differs else set()
        if not second.differs:
            return set()
        third = self._from_peers(holders, f, start, end, view, write=True)
        if third is None:
            raise Inconclusive(f"{second.node} and {node} differ on bytes {start}-{end - 1}, no third source{why}")
        return {node} if third.differs else {second.node}

    def _from_peers(self, holders, f: FileProgress, start: int, end: int, view: memoryview, *, write: bool):
        """``[start, end)`` compared with what ``holders`` send, each taking over where the one before
        failed: the ``Compare`` (``node``: the peer that sent the bytes that differ, or the last bytes), or
        ``None`` when they all failed."""
        compare = Compare(self._fd, self._scratch, start, write=write)
        for holder in holders:
            if self._stopped():
                raise Inconclusive("the download stopped")
            self._spend(end - compare.pos)
            compare.node = holder.node
            if self._from_peer(holder, f, compare, end, view):
                return compare
        return None

    def _spend(self, n: int) -> None:
        if n > self._budget:
            raise Inconclusive("checking more would read more than the file's size again")
        self._budget -= n

    def _from_peer(self, holder, f: FileProgress, compare: Compare, end: int, view: memoryview) -> bool:
        """Compare what ``holder`` sends of ``[compare.pos, end)``; True once it told all it had to (every
        byte, or the first that differs). A peer failing is counted against it."""
        start, began, told = compare.pos, time.monotonic(), False
        try:
            self.client.read(holder.peer, f, start, end, view, compare, self._stopped)
            told = compare.pos >= end
        except Differs:
            told = True
        except PeerBusy:
            pass
        except PeerMissing:
            self.board.forget(holder.node, f.file.path)
        except PeerError:
            self.board.peer_failed(holder.node)
        moved = compare.pos - start
        self._budget += end - start - moved  # what it did not send is not spent
        self.bytes += moved
        self.board.received(holder.node, moved, time.monotonic() - began)
        self._count(holder.node, moved)
        return told
