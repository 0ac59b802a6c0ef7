"""What the ``Board`` (``swarm``) schedules: a download's segments, the peers it knows and their tuning.

- ``Segment``: bytes of a file still to fetch, in flight from one source at a time;
- ``PeerState``: what the download knows of one peer (the ranges it holds, its failures, its rate);
- ``SwarmSettings``: the fan-out's tuning; ``segment_size``: how big the segments of a download are.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
from dataclasses import dataclass, field

from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.ticket import PeerSource

KiB = 1024
MiB = 1024 * KiB
HUB = "hub"  # the source of a segment fetched from the ticket's hubs (in their failover order)
MIN_SEGMENT = 256 * KiB
MIN_PIECE = 64 * KiB  # a straggler's tail is cut on this grain, and never smaller


@dataclass
class SwarmSettings:
    """Tuning of the fan-out (defaults suit a cluster's network)."""

    peer_connections: int = 4  # requests in flight to one peer
    peer_wait: float = 120.0  # seconds a segment waits for a peer before this node asks the hub anyway
    peer_stall: float = 15.0  # a Downloading peer whose ranges did not grow for this long owns nothing
    peer_refresh: float = 2.0  # seconds between asks for the ticket's peer list
    peer_settle: float = 2.0  # nodes still joining, none Ready: no hub request for at most this long
    peer_poll: float = 0.5  # seconds between tree answers asked of each Downloading peer
    straggle_seconds: float = 2.0  # a segment in flight is never a straggler sooner
    hub_floor: int = 2  # hub requests kept running while owned segments wait
    max_segments: int = 256
    coalesce_bytes: int = 4 * MiB  # pending segments a peer holds one after another: asked for together, up to this
    coalesce_seconds: float = 0.5  # ... and up to what the peer's measured rate sends in this long


def segment_size(total: int, part_size: int, max_segments: int = 256) -> int:
    """The segment size for ``total`` bytes: about ``max_segments`` segments, 256 KiB to ``part_size``."""
    size = -(-max(total, 1) // max_segments)
    size = -(-size // MIN_PIECE) * MIN_PIECE
    return max(MIN_SEGMENT, min(part_size, size))


def node_rank(*parts: object) -> bytes:
    """The rendezvous hash of ``parts`` (a node's rank for a segment)."""
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()


@dataclass(eq=False)
class Segment:
    """``[pos, end)`` of ``f`` still to fetch (``start`` where it began); ``end`` may shrink while in
    flight (a straggler's tail cut off) and is read and written under ``lock``."""

    f: FileProgress
    index: int
    start: int
    end: int
    epoch: int
    waiting_since: float
    pos: int = -1
    claim: int = -1  # how far the read under way reaches (a cut never goes below it)
    source: str | None = None  # while in flight: HUB or a peer's node
    started: float = 0.0
    splittable: bool = False
    owner: str = ""
    owner_version: int = -1
    holders: tuple = ()  # the peers holding [pos, end) when ``holders_key`` was the board's
    holders_key: tuple | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.pos = self.claim = self.start

    @property
    def remaining(self) -> int:
        return max(0, self.end - self.pos)


class PeerState:
    """What this download knows of one peer."""

    def __init__(self, peer: PeerSource, now: float):
        self.peer = peer
        self.node = peer.node
        self.ready = peer.state == "Ready"
        self.have: dict[str, tuple[list[int], list[int]]] = {}
        self.have_total = -1
        self.progress_at = now  # when its ranges last grew (or it appeared)
        self.failures = 0
        self.dead = self.banned = False
        self.demoted = False  # answered 416 for what it listed: owns no share of the hub's bytes
        self.busy_until = 0.0
        self.active = 0
        self.bytes = 0
        self.busy_seconds = 0.0

    def usable(self, now: float) -> bool:
        return not (self.dead or self.banned) and now >= self.busy_until

    def owns(self, now: float, stall: float) -> bool:
        """May own segments: alive, not banned, Ready or making progress."""
        if self.dead or self.banned or self.demoted:
            return False
        return self.ready or now - self.progress_at < stall

    def holds(self, path: str, start: int, end: int) -> bool:
        if self.ready:
            return True
        ranges = self.have.get(path)
        if ranges is None:
            return False
        starts, ends = ranges
        i = bisect.bisect_right(starts, start) - 1
        return i >= 0 and ends[i] >= end

    def rate(self) -> float | None:
        return self.bytes / self.busy_seconds if self.bytes and self.busy_seconds > 0 else None

    def update_have(self, state: str, files: dict[str, list[tuple[int, int]]], now: float) -> None:
        self.ready = self.ready or state == "Ready"
        have = {}
        total = 0
        for path, ranges in files.items():
            merged = sorted(ranges)
            have[path] = ([s for s, _ in merged], [e for _, e in merged])
            total += sum(e - s for s, e in merged)
        if total > self.have_total:
            self.progress_at = now
        self.have, self.have_total, self.failures = have, total, 0


class Finished(Exception):
    """Every segment is fetched."""
