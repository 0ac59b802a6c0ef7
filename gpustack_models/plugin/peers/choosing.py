"""How the ``Board`` (``swarm``) chooses a fetching thread's next segment and its source.

Peers first, each segment from the peer that promises the best throughput; the hub only for the
segments no usable peer holds that this node owns (rendezvous hashing over the live nodes) or that
waited ``peer_wait`` for a peer, this node's surest share first; and, when nothing else can start, the
tail of a straggling segment cut off for another source. The module docstring of ``swarm`` tells why.
"""

from __future__ import annotations

import threading
import time

from gpustack_models.plugin.peers.segments import HUB, MIN_PIECE, Finished, PeerState, Segment, SwarmSettings, node_rank


class Choosing:
    """The ``Board``'s choice of the next ``(segment, source)``; the board's state, read and changed
    under its ``cond``, is declared below."""

    node: str
    digest: str
    settings: SwarmSettings
    cond: threading.Condition
    peers: dict[str, PeerState]
    pending: list[Segment]
    inflight: set[Segment]
    hub_active: int
    hub_allowed: bool
    version: int
    fine: bool
    hold_until: float
    _owning: frozenset[str]

    def take(self) -> tuple[Segment, str] | None:
        """The next segment and its source; ``None``: wait; raises ``Finished`` when nothing is left."""
        now = time.monotonic()
        with self.cond:
            if not self.pending and not self.inflight:
                raise Finished
            if not self.fine and now < self.hold_until:
                return None
            owning = frozenset(n for n, p in self.peers.items() if p.owns(now, self.settings.peer_stall))
            if owning != self._owning:
                self._owning = owning
                self.version += 1
            choice = self._choose(now) or self._straggler(now)
            if choice is not None:
                self._start(*choice, now)
            return choice

    def _choose(self, now: float) -> tuple[Segment, str] | None:
        """A pending segment from its best peer, else an owned one from the hub; the hub first while
        fewer than ``hub_floor`` hub requests run (caller holds ``cond``)."""
        peers = [p for p in self.peers.values() if not (p.dead or p.banned)]
        if self.hub_active < self.settings.hub_floor:
            pick = self._hub_pick(peers, now)
            if pick is not None:
                return pick, HUB
        for seg in self.pending:
            best = self._best([p for p in peers if p.holds(seg.f.file.path, seg.pos, seg.end)], now)
            if best is not None:
                return seg, best.node
        pick = self._hub_pick(peers, now)
        return (pick, HUB) if pick is not None else None

    def _hub_pick(self, peers: list[PeerState], now: float) -> Segment | None:
        """The pending segment no peer holds that this node should ask the hub for, in this node's own
        order (caller holds ``cond``)."""
        pick, best = None, None
        for seg in self.pending:
            if any(p.holds(seg.f.file.path, seg.pos, seg.end) for p in peers) or not self._hub_ok(seg, now):
                continue
            # Our surest share first: the segments where our own hash ranks highest stay ours however
            # many nodes we have not heard of yet; the doubtful ones wait until the peer list is fuller.
            rank = (0, -int.from_bytes(node_rank(self.node, self.digest, seg.f.file.path, seg.index)[:8], "big"))
            rank = rank if self.fine else (1, (seg.f.file.path, seg.start))
            if best is None or rank < best:
                pick, best = seg, rank
        return pick

    def _best(self, holders: list[PeerState], now: float) -> PeerState | None:
        limit = self.settings.peer_connections
        best, score = None, -1.0
        for p in holders:
            if not p.usable(now) or p.active >= limit:
                continue
            rate = p.rate()
            s = (rate if rate is not None else float("inf")) / (p.active + 1)
            if s > score:
                best, score = p, s
        return best

    def _start(self, seg: Segment, source: str, now: float) -> None:
        """Caller holds ``cond``."""
        if seg in self.pending:
            self.pending.remove(seg)
        self.inflight.add(seg)
        seg.source, seg.started = source, now
        seg.splittable = True
        if source == HUB:
            self.hub_active += 1
        else:
            self.peers[source].active += 1

    def _straggler(self, now: float) -> tuple[Segment, str] | None:
        """Cut the tail off the slowest peer segment in flight for another source (caller holds ``cond``)."""
        for seg in sorted(self.inflight, key=lambda s: s.started):
            if not seg.splittable or not self._lagging(seg, now):
                continue
            with seg.lock:
                reach = max(seg.pos, seg.claim)
                cut = reach + max(MIN_PIECE, ((seg.end - reach) // 2) // MIN_PIECE * MIN_PIECE)
                if seg.end - cut < MIN_PIECE:
                    continue
                tail = Segment(seg.f, seg.index, cut, seg.end, seg.epoch, seg.waiting_since)
                others = [p for n, p in self.peers.items() if n != seg.source and not (p.dead or p.banned)]
                holders = [p for p in others if p.holds(seg.f.file.path, cut, tail.end)]
                best = self._best(holders, now)
                hub = seg.source != HUB and not holders and self._hub_ok(tail, now)
                source = best.node if best is not None else (HUB if hub else None)
                if source is None:
                    continue
                seg.end = cut
            seg.splittable = False
            self.inflight.add(tail)
            return tail, source
        return None

    def _lagging(self, seg: Segment, now: float) -> bool:
        elapsed = now - seg.started
        if elapsed < self.settings.straggle_seconds or seg.remaining < 2 * MIN_PIECE:
            return False
        rates = [r for p in self.peers.values() if not (p.dead or p.banned) and (r := p.rate())]
        return bool(rates) and elapsed > 4 * (seg.end - seg.start) / max(rates)

    # ---------------------------------------------------------------- ownership

    def _owner(self, seg: Segment, now: float) -> str:
        """The live node owning ``seg`` (caller holds ``cond``)."""
        if seg.owner_version == self.version:
            return seg.owner
        stall = self.settings.peer_stall
        nodes = [self.node] + [n for n, p in self.peers.items() if p.owns(now, stall)]
        path = seg.f.file.path
        owner = max(nodes, key=lambda n: node_rank(n, self.digest, path, seg.index))
        seg.owner, seg.owner_version = owner, self.version
        return owner

    def _hub_ok(self, seg: Segment, now: float) -> bool:
        if not self.hub_allowed or now < self.hold_until:
            return False
        if now - seg.waiting_since >= self.settings.peer_wait:
            return True
        return self._owner(seg, now) == self.node
