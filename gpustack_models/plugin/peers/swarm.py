"""Scheduling a download's segments over several sources at once: the peers and the hub.

A node that downloads a digest its fetch ticket also lists on other nodes (``FetchTicket.peers``:
Ready, or Downloading with some ranges) fetches from those peers and from the hub together, every
byte verified against the manifest as from the hub (``frontier``). The ``Board`` decides who fetches
what (it keeps the segments and the peers' state, ``segments``; how it chooses is ``choosing``'s):

- **Segments.** The missing bytes are cut into segments: a file smaller than the segment size is
  one; bigger files are cut every ``segment_size`` bytes (the total over about 256 segments, at
  least 256 KiB and at most ``part_size``), so many nodes share a model evenly, and few enough that
  each request's own cost (its headers, its admission, its thread's turn) stays small beside its bytes.
- **Peers first.** A segment that a usable peer holds (a Ready peer holds everything; a Downloading
  one the ranges its last tree answer listed) is fetched from the peer that promises the best
  throughput: measured bytes per busy second over its finished segments, divided by its requests in
  flight (an untried peer is tried first), at most ``peer_connections`` requests per peer. The
  pending segments right after it that the same peer holds go in the same request, up to what
  that peer sent in ``coalesce_seconds`` at its measured rate and at most ``coalesce_bytes`` (a fast
  Ready peer's file in a few requests, not one per segment; an untried or slow peer one segment).
- **The hub only for what no peer can give, and only "its" share.** Nodes starting together hold
  nothing: each segment is *owned* by one of the live nodes wanting the digest (this node and the
  ticket's peers not dead, banned or stalled), chosen by rendezvous hashing of node name, digest,
  file and segment index. A node asks the hub for a segment no usable peer holds only when it owns
  it, or when the segment has waited ``peer_wait`` seconds for a peer (a bound, should an owner
  never get it). When a peer dies, is banned or stops making progress for ``peer_stall`` seconds,
  its segments move to the next node in each segment's hash order, so its share is fetched once,
  not by everyone. At least two hub requests run whenever owned segments wait, so a node always
  moves its share forward while it takes the rest from peers. The ticket's peer list is asked for
  again every ``peer_refresh`` seconds, so nodes that started with no peer soon know each other.
  Nodes placed together may not all be listed in each other's first ticket (the service places a digest
  on one node at a time): a ticket with no Ready peer whose API knows of nodes still joining
  (``FetchTicket.joining``) asks the hub nothing for ``peer_settle`` seconds, or until the ticket,
  asked for again every ``peer_poll`` seconds meanwhile, lists them all, so that the nodes placed
  together all count in each segment's owner; then a node asks the hub for its surest share first, the
  segments where its own hash ranks highest, which stay its own however many nodes it has not heard of
  yet. A node alone, or whose ticket lists every node that wants the digest, does not wait.
- **Stragglers.** When nothing else can be started and a peer's segment in flight has taken four
  times what the fastest peer's rate promises (and at least ``straggle_seconds``), the segment's tail is
  cut off (at the middle of what remains, never below the bytes being written) and handed to
  another source holding it; the slow request stops at the cut, so no byte is written twice.
- **Bans.** A peer that sends bad bytes is found when a file it wrote to fails its hash. The ranges
  each peer wrote to it are read once more from a second source (the ticket's hubs, or a peer
  holding them when no hub serves them) and compared; bytes that differ are replaced and the file
  is hashed again (``recheck``). If it matches now, only the peers whose bytes differed are banned for
  the rest of the download; the others keep serving. If the re-check cannot tell (no second source,
  no byte differed, or the file still fails), every peer that wrote bytes of that file is banned, the
  file's bytes are thrown away (a new epoch of the file: writers of the old one stop writing) and its
  segments are fetched again. A file only the hub wrote fails the download, as before.
- **Failures.** A request that drops or stalls puts the segment's remainder back; a peer whose
  requests or tree answers fail twice in a row is dead for the download; 416 (it does not hold the
  range after all) forgets what it listed; 503 waits ``Retry-After`` (at most 2 s) for that peer.

Everything the ``Board`` knows is in memory: checkpoints hold written ranges as for the hub, so a
resumed download schedules only what is missing, peers or not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.ticket import PeerSource
from gpustack_models.plugin.peers.choosing import Choosing
from gpustack_models.plugin.peers.segments import (
    HUB,
    MIN_PIECE,
    Finished,
    PeerState,
    Segment,
    SwarmSettings,
    segment_size,
)

__all__ = [
    "HUB",
    "MIN_PIECE",
    "Board",
    "Finished",
    "PeerState",
    "Segment",
    "SwarmSettings",
    "segment_size",
]


class Board(Choosing):
    """The segments of one download and the sources they go to (see the module's docstring).

    ``take()`` (``Choosing``) hands a fetching thread its next ``(segment, source)``, ``None`` when it should
    wait, or raises ``Finished``; the thread reports back with ``done``, ``put_back`` or ``failed``.
    Thread-safe: one condition guards everything; ``wait()`` sleeps until something changes."""

    def __init__(
        self,
        node: str,
        digest: str,
        files: Iterable[FileProgress],
        settings: SwarmSettings,
        part_size: int,
        *,
        total: int | None = None,
        split_threshold: int | None = None,
        fine: bool = True,
    ):
        self.node, self.digest, self.settings = node, digest, settings
        self.cond = threading.Condition()
        self.peers: dict[str, PeerState] = {}
        self.pending: list[Segment] = []
        self.inflight: set[Segment] = set()
        self.hub_active = 0
        self.hub_allowed = True
        self.version = 0  # of the set of nodes that may own segments
        self.have_version = 0  # of what the peers hold (a segment's holders are kept while it is the same)
        self._ranks: dict[tuple, bytes] = {}  # (node, path, index) -> its rendezvous rank
        self._owning: frozenset[str] = frozenset()
        files = list(files)
        total = total if total is not None else sum(f.size for f in files)
        self.size = segment_size(total, part_size, settings.max_segments)
        self._part_size, self._split = part_size, split_threshold or part_size
        self.fine = fine  # False: the hub's parts, in file order, until a peer shows up
        self.hold_until = 0.0  # no hub request before (``settle``)
        now = time.monotonic()
        for f in files:
            if not (f.verified or f.complete):
                for start, end in f.missing():
                    self.pending.extend(self._cut(f, start, end, now))

    def _cut(self, f: FileProgress, start: int, end: int, now: float) -> list[Segment]:
        if not self.fine:  # as a download from the hub alone cuts its parts
            step = self._part_size if f.size >= self._split else max(end - start, 1)
            return [Segment(f, s // self.size, s, min(end, s + step), f.epoch, now) for s in range(start, end, step)]
        size = self.size
        first = start // size
        out = []
        for index in range(first, -(-end // size)):
            lo, hi = max(start, index * size), min(end, (index + 1) * size)
            if lo < hi:
                out.append(Segment(f, index, lo, hi, f.epoch, now))
        return out

    # ---------------------------------------------------------------- peers

    def set_peers(self, peers: Iterable[PeerSource]) -> None:
        """The ticket's current peers: new ones join; one no longer listed is gone for this download."""
        now = time.monotonic()
        with self.cond:
            listed = {p.node: p for p in peers if p.node != self.node}
            for node, peer in listed.items():
                state = self.peers.get(node)
                if state is None:
                    self.peers[node] = PeerState(peer, now)
                elif peer.state == "Ready":
                    state.ready = True
            for node, state in self.peers.items():
                if node not in listed and not state.dead:
                    state.dead = True
            if listed and not self.fine:
                self._refine(now)
            self.have_version += 1
            self._changed()

    def _refine(self, now: float) -> None:
        """Peers showed up: cut what is left into segments, the parts in flight at what they read now
        (caller holds ``cond``)."""
        self.fine = True
        rest = [(s.f, s.pos, s.end) for s in self.pending]
        for seg in self.inflight:
            with seg.lock:
                cut = -(-max(seg.claim, seg.pos) // MIN_PIECE) * MIN_PIECE
                if cut < seg.end:
                    rest.append((seg.f, cut, seg.end))
                    seg.end = cut
        self.pending = []
        for f, start, end in sorted(rest, key=lambda r: (r[0].file.path, r[1])):
            self.pending.extend(self._cut(f, start, end, now))

    def polled(self, node: str, state: str, files: dict[str, list[tuple[int, int]]]) -> None:
        with self.cond:
            peer = self.peers.get(node)
            if peer is not None:
                peer.update_have(state, files, time.monotonic())
                self.have_version += 1
                self.cond.notify_all()

    def peer_failed(self, node: str, *, fatal: bool = False, busy: float = 0.0) -> None:
        """A request or tree answer of ``node`` failed (``fatal``: it refused us); ``busy``: it asked us
        to come back in that many seconds."""
        with self.cond:
            peer = self.peers.get(node)
            if peer is None:
                return
            if busy:
                peer.busy_until = time.monotonic() + min(busy, 2.0)
            else:
                peer.failures += 1
                if fatal or peer.failures >= 2:
                    peer.dead = True
            self._changed()

    def forget(self, node: str, path: str) -> None:
        """``node`` answered 416: it does not hold what it listed of ``path``."""
        with self.cond:
            peer = self.peers.get(node)
            if peer is not None:
                peer.have.pop(path, None)
                peer.ready, peer.demoted = False, True
                self.have_version += 1

    def ban(self, nodes: Iterable[str]) -> list[str]:
        with self.cond:
            banned = [n for n in nodes if n in self.peers and not self.peers[n].banned]
            for node in banned:
                self.peers[node].banned = True
            self._changed()
            return banned

    def _changed(self) -> None:
        """Caller holds ``cond``."""
        self.version += 1
        self.cond.notify_all()

    def candidates(self) -> list[PeerState]:
        """The peers worth polling for their ranges."""
        with self.cond:
            return [p for p in self.peers.values() if not (p.dead or p.banned or p.ready)]

    def peer_bytes(self) -> dict[str, int]:
        with self.cond:
            return {node: p.bytes for node, p in self.peers.items() if p.bytes}

    def banned(self) -> list[str]:
        with self.cond:
            return sorted(node for node, p in self.peers.items() if p.banned)

    def holders(self, path: str, start: int, end: int, exclude: Iterable[str]) -> list[PeerState]:
        """The usable peers holding ``[start, end)`` of ``path``, but ``exclude``, the fastest first (a
        second source for bytes being re-checked)."""
        now, exclude = time.monotonic(), set(exclude)
        with self.cond:
            found = [
                p for n, p in self.peers.items() if n not in exclude and p.usable(now) and p.holds(path, start, end)
            ]
        return sorted(found, key=lambda p: -(p.rate() or float("inf")))

    def received(self, node: str, moved: int, seconds: float) -> None:
        """``node`` sent ``moved`` bytes outside a segment (a re-check) in ``seconds``."""
        with self.cond:
            peer = self.peers.get(node)
            if peer is not None:
                peer.bytes += moved
                peer.busy_seconds += seconds

    # ---------------------------------------------------------------- holding the hub back

    def settle(self, seconds: float) -> None:
        """Ask the hub nothing for ``seconds`` (or until ``release``): nodes that start together learn
        of each other before each asks the hub for the start of every file."""
        with self.cond:
            self.hold_until = time.monotonic() + seconds

    def held(self) -> bool:
        """The hub is asked nothing yet (``settle``)."""
        with self.cond:
            return time.monotonic() < self.hold_until

    def release(self) -> None:
        """End the ``settle`` now: the nodes it waited for are known."""
        with self.cond:
            self.hold_until = 0.0
            self.cond.notify_all()

    # ---------------------------------------------------------------- reports

    def _finish(self, seg: Segment, moved: int, seconds: float) -> None:
        """Caller holds ``cond``."""
        self.inflight.discard(seg)
        if seg.source == HUB:
            self.hub_active -= 1
        elif seg.source in self.peers:
            peer = self.peers[seg.source]
            peer.active -= 1
            peer.bytes += moved
            peer.busy_seconds += seconds
            if moved:
                peer.failures = 0
        self.cond.notify_all()

    def done(self, seg: Segment, moved: int, seconds: float) -> None:
        """``seg`` was fetched (or cut short by a straggler split at what it wrote)."""
        with self.cond:
            self._finish(seg, moved, seconds)
            seg.source = None

    def put_back(self, seg: Segment, moved: int, seconds: float) -> None:
        """``seg`` stopped at ``seg.pos``: its remainder waits for another try (if its file's epoch is
        still the same)."""
        with self.cond:
            self._finish(seg, moved, seconds)
            seg.source = None
            if seg.remaining and seg.epoch == seg.f.epoch:  # cut again: it may have been several joined
                rest = self._cut(seg.f, seg.pos, seg.end, seg.waiting_since)
                at = self._position(rest[0])
                self.pending[at:at] = rest

    def _position(self, seg: Segment) -> int:
        for i, other in enumerate(self.pending):
            if (other.f.file.path, other.start) > (seg.f.file.path, seg.start):
                return i
        return len(self.pending)

    def refetch(self, f: FileProgress) -> None:
        """``f`` was thrown away (``FileProgress.refetch``): its segments start over."""
        with self.cond:
            self.pending = [s for s in self.pending if s.f is not f]
            fresh = self._cut(f, 0, f.size, time.monotonic())
            at = self._position(fresh[0]) if fresh else 0
            self.pending[at:at] = fresh
            self.cond.notify_all()

    def wait(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait(timeout)

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()
