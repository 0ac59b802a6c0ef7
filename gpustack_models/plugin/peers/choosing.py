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
    size: int
    version: int
    have_version: int
    _ranks: dict[tuple, bytes]
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
        if self.hub_active < self.settings.hub_floor:
            pick = self._hub_pick(now)
            if pick is not None:
                return pick, HUB
        limit = self.settings.peer_connections
        free = {n for n, p in self.peers.items() if p.usable(now) and p.active < limit}
        if free:  # else no peer could take a segment now: none is looked at
            for at, seg in enumerate(self.pending):
                best = self._best([p for p in self._holders(seg) if p.node in free], now)
                if best is not None:
                    return self._coalesce(at, best), best.node
        pick = self._hub_pick(now)
        return (pick, HUB) if pick is not None else None

    def _coalesce(self, at: int, peer: PeerState) -> Segment:
        """The pending segment at ``at`` joined with the ones right after it in its file that ``peer`` holds
        too, up to what it sent in ``coalesce_seconds`` so far and at most ``coalesce_bytes``: one request
        instead of several (caller holds ``cond``); a peer not measured yet gets one segment. The joined
        segment is new; a remainder put back is cut on segment boundaries again."""
        first, rate = self.pending[at], peer.rate()
        if rate is None:  # untried: one segment, until it shows its speed
            return first
        reach = max(
            first.end - first.pos, min(self.settings.coalesce_bytes, int(rate * self.settings.coalesce_seconds))
        )
        end, count, limit = first.end, 1, first.pos + reach
        path = first.f.file.path
        for nxt in self.pending[at + 1 :]:
            if nxt.f is not first.f or nxt.epoch != first.epoch or nxt.start != end or nxt.end > limit:
                break
            if not peer.holds(path, first.pos, nxt.end):
                break
            end, count = nxt.end, count + 1
        if count == 1:
            return first
        waited = min(s.waiting_since for s in self.pending[at : at + count])
        del self.pending[at : at + count]
        return Segment(first.f, first.index, first.pos, end, first.epoch, waited)

    def _holders(self, seg: Segment) -> tuple[PeerState, ...]:
        """The peers holding what is left of ``seg``, dead or alive: worked out again only when what the peers
        hold changed (``have_version``) or the segment moved (caller holds ``cond``)."""
        key = (self.have_version, seg.pos, seg.end)
        if seg.holders_key != key:
            path = seg.f.file.path
            seg.holders = tuple(p for p in self.peers.values() if p.holds(path, seg.pos, seg.end))
            seg.holders_key = key
        return seg.holders

    def _rank(self, node: str, seg: Segment) -> bytes:
        """``node``'s rendezvous rank for ``seg``, computed once (caller holds ``cond``)."""
        key = (node, seg.f.file.path, seg.index)
        rank = self._ranks.get(key)
        if rank is None:
            rank = self._ranks[key] = node_rank(node, self.digest, seg.f.file.path, seg.index)
        return rank

    def _hub_pick(self, now: float) -> Segment | None:
        """The pending segment no live peer holds that this node should ask the hub for, in this node's
        own order (caller holds ``cond``)."""
        pick, best = None, None
        for seg in self.pending:
            if not self._hub_ok(seg, now) or any(not (p.dead or p.banned) for p in self._holders(seg)):
                continue
            # Our surest share first: the segments where our own hash ranks highest stay ours however
            # many nodes we have not heard of yet; the doubtful ones wait until the peer list is fuller.
            rank = (0, -int.from_bytes(self._rank(self.node, seg)[:8], "big"))
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
                tail = Segment(seg.f, cut // self.size, cut, seg.end, seg.epoch, seg.waiting_since)
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
        owner = max(nodes, key=lambda n: self._rank(n, seg))
        seg.owner, seg.owner_version = owner, self.version
        return owner

    def _hub_ok(self, seg: Segment, now: float) -> bool:
        if not self.hub_allowed or now < self.hold_until:
            return False
        if now - seg.waiting_since >= self.settings.peer_wait:
            return True
        return self._owner(seg, now) == self.node
