"""A peer sending bad bytes among honest ones: the file that fails its hash is re-checked range by range
against a second source, only the peer whose bytes differ is banned, the honest peers keep serving, and
the published tree verifies. Fake hubs play the peers (the plugin's peer endpoints, over TLS) beside the
ticket's hub."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re

import pytest

from gpustack_models.plugin.engine import READY
from gpustack_models.plugin.engine.failures import SOURCE_UNAVAILABLE, DownloadFailed
from gpustack_models.plugin.engine.frontier import HashFrontier
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.ticket import PeerSource
from gpustack_models.plugin.peers.recheck import Compare, Differs, Recheck, pieces
from gpustack_models.plugin.peers.swarm import Board, SwarmSettings, segment_size
from gpustack_models.sources.manifest import ManifestFile
from tests.plugin import test_swarm
from tests.plugin.conftest import FAST, KiB, MiB, random_bytes, tree_files
from tests.plugin.test_swarm import FILES, ME, engine_with_peers, served, with_peers

# The peers' fixtures: their CA and certificate, fake hubs serving the peer endpoints, the model on the hub.
pki_files, peers, origin = test_swarm.pki_files, test_swarm.peers, test_swarm.origin

SEGMENT = 256 * KiB
BAD = "model-00001.safetensors"  # the liar flips a byte in every range it sends of this file


def peer_requests(hub, path: str = "") -> list:
    return [r for r in hub.requests if r.method == "GET" and "/files/" in r.path and path in r.path]


def test_only_the_peer_whose_bytes_differ_is_banned_and_the_honest_ones_keep_serving(
    fakehub, origin, peers, pki_files, make_engine
):
    liar, honest_a, honest_b = peers(3)
    for hub in (liar, honest_a, honest_b):
        hub.serve_peer(origin.hex, FILES, client=ME)
        hub.faults.throttle("/peer/v1/", 1 * MiB)
    liar.faults.corrupt(BAD, times=None)
    # One request per peer at a time, each at 1 MiB/s: the bad file fails while later files still wait for
    # their segments.
    engine = engine_with_peers(make_engine, pki_files, peer_connections=1)

    engine.ensure(with_peers(origin, [liar, honest_a, honest_b], names=["liar", "honest-a", "honest-b"]))
    entry = engine.wait(origin.digest, timeout=60)

    assert entry.state == READY, entry
    assert tree_files(engine.path(origin.digest)) == FILES
    stats = engine.stats(origin.digest)
    assert stats["banned"] == ["liar"] and stats["banned_peers"] == 1, stats
    assert peer_requests(liar, BAD), "the liar sent none of the bad file's bytes"
    # The honest peers went on serving once the liar was banned (after its last request).
    last_lie = max(r.started for r in peer_requests(liar))
    assert [r for r in peer_requests(honest_a) + peer_requests(honest_b) if r.started > last_lie]
    # The hub served only the re-check: the bad file's peers' ranges once, at most the file's size.
    assert 0 < stats["rechecked_bytes"] == served(fakehub) <= len(FILES[BAD]), (stats, served(fakehub))


def test_the_hub_is_the_second_source_for_ranges_no_other_peer_holds(fakehub, origin, peers, pki_files, make_engine):
    liar, honest = peers(2)
    liar.serve_peer(origin.hex, FILES, client=ME)
    liar.faults.corrupt(BAD, times=None)
    liar.faults.throttle("/peer/v1/", 1 * MiB)
    # The honest peer holds the bad file from its third MiB on: the liar alone holds the first two.
    have = {path: [(0, len(data))] for path, data in FILES.items()}
    have[BAD] = [(2 * MiB, len(FILES[BAD]))]
    honest.serve_peer(origin.hex, FILES, client=ME, have=have, state="Downloading")
    listed = (PeerSource("liar", liar.url, "Ready"), PeerSource("honest", honest.url, "Downloading"))
    engine = engine_with_peers(make_engine, pki_files, peer_poll=0.05)

    engine.ensure(dataclasses.replace(origin, peers=listed))
    entry = engine.wait(origin.digest, timeout=60)

    assert entry.state == READY, entry
    assert tree_files(engine.path(origin.digest)) == FILES
    stats = engine.stats(origin.digest)
    assert stats["banned"] == ["liar"], stats
    assert peer_requests(honest, BAD), "the honest peer wrote none of the bad file"
    # Only the hub could tell the liar's first two MiB: it served them again, and at most the file.
    assert 2 * MiB <= stats["rechecked_bytes"] == served(fakehub) <= len(FILES[BAD]), (stats, served(fakehub))


def test_peers_outvote_the_liar_when_the_hub_serves_nothing(fakehub, origin, peers, pki_files, make_engine):
    liar, honest_a, honest_b = peers(3)
    for hub in (liar, honest_a, honest_b):
        hub.serve_peer(origin.hex, FILES, client=ME)
    liar.faults.corrupt(BAD, times=None)
    fakehub.faults.fail(re.compile("/resolve/"), 503, times=None)  # the hub serves no file byte
    engine = engine_with_peers(make_engine, pki_files, peer_connections=2)

    engine.ensure(with_peers(origin, [liar, honest_a, honest_b], names=["liar", "honest-a", "honest-b"]))
    entry = engine.wait(origin.digest, timeout=60)

    assert entry.state == READY, entry
    assert tree_files(engine.path(origin.digest)) == FILES
    stats = engine.stats(origin.digest)
    assert stats["banned"] == ["liar"], stats
    assert served(fakehub) == 0 and stats["by_source"]["hub"] == 0, stats
    # The peers' ranges once, and at most a segment more for each peer outvoted.
    segment = segment_size(sum(len(b) for b in FILES.values()), FAST["part_size"])
    assert 0 < stats["rechecked_bytes"] <= len(FILES[BAD]) + 3 * segment, stats


def test_two_peers_that_disagree_without_a_hub_fall_back_to_banning_both(
    fakehub, origin, peers, pki_files, make_engine, caplog
):
    liar, honest = peers(2)
    for hub in (liar, honest):
        hub.serve_peer(origin.hex, FILES, client=ME)
    liar.faults.corrupt(BAD, times=None)
    fakehub.faults.fail(re.compile("/resolve/"), 503, times=None)
    engine = engine_with_peers(make_engine, pki_files, peer_connections=2)

    engine.ensure(with_peers(origin, [liar, honest], names=["liar", "honest"]))
    entry = engine.wait(origin.digest, timeout=60)

    # Nobody to tell which of the two lies: both banned, the file thrown away, and with the hub down the
    # download fails; nothing is published.
    assert entry.state == "Failed", entry
    assert engine.path(origin.digest) is None
    assert engine.stats(origin.digest)["banned"] == ["honest", "liar"]
    assert re.search(rf"{BAD} could not be re-checked \(.*no third source", caplog.text), caplog.text


def test_a_peers_ranges_are_checked_a_segment_at_a_time():
    assert pieces([[0, 300], [500, 1100]], 256) == [
        (0, 256),
        (256, 300),
        (500, 512),
        (512, 768),
        (768, 1024),
        (1024, 1100),
    ]


def test_a_second_sources_bytes_are_compared_and_written_only_where_they_differ_when_trusted(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"a" * 100)
    fd = os.open(path, os.O_RDWR)
    try:
        same = Compare(fd, bytearray(64), 0, write=False)
        same(memoryview(b"a" * 50), 0)
        assert (same.pos, same.differs) == (50, False)
        doubting = Compare(fd, bytearray(64), 50, write=False)
        with pytest.raises(Differs):
            doubting(memoryview(b"a" * 10 + b"b" * 40), 50)
        assert doubting.differs and path.read_bytes() == b"a" * 100  # a doubt writes nothing
        trusted = Compare(fd, bytearray(64), 50, write=True)
        trusted(memoryview(b"a" * 10 + b"b" * 40), 50)
        assert trusted.differs and path.read_bytes() == b"a" * 60 + b"b" * 40
    finally:
        os.close(fd)


class Peers:
    """Peers answering ``PeerClient.read`` from memory: the liar's bytes differ in every range it sends."""

    def __init__(self, data: bytes, liar: str):
        self.data, self.liar, self.asked = data, liar, []

    def read(self, peer, f, start, end, view, sink, stopped) -> int:
        self.asked.append((peer.node, start))
        for pos in range(start, end, len(view)):
            chunk = bytearray(self.data[pos : min(end, pos + len(view))])
            if peer.node == self.liar:
                chunk[len(chunk) // 2] ^= 0xFF
            sink(memoryview(chunk), pos)
        return end - start


def test_a_liar_asked_as_a_second_source_is_outvoted_and_the_peer_it_contradicted_is_not_banned(tmp_path):
    data = random_bytes(4 * SEGMENT, seed=7)
    f = FileProgress(ManifestFile("a.bin", len(data), "sha256", hashlib.sha256(data).hexdigest()), tmp_path / "a.bin")
    f.new_hash()
    lies = bytearray(data)
    for start in (SEGMENT, 2 * SEGMENT):  # the liar wrote the middle two segments, each with a bad byte
        lies[start + SEGMENT // 2] ^= 0xFF
    (tmp_path / "a.bin").write_bytes(lies)
    with f.lock:
        f.add_range(0, len(data))
        for node, start, end in (("x", 0, SEGMENT), ("liar", SEGMENT, 3 * SEGMENT), ("z", 3 * SEGMENT, 4 * SEGMENT)):
            f.note_peer(node, start, end)
    f.bad = True
    board = Board("me", "sha256:" + "e" * 64, [], SwarmSettings(), SEGMENT, total=len(data))
    board.set_peers([PeerSource(n, "https://127.0.0.1:1", "Ready") for n in ("x", "liar", "z")])
    board.peers["liar"].bytes, board.peers["liar"].busy_seconds = 10**9, 1.0  # the fastest: asked first
    for node in ("x", "z"):
        board.peers[node].bytes, board.peers[node].busy_seconds = 10**6, 1.0
    peers = Peers(data, "liar")

    def hub(*_):
        raise DownloadFailed(SOURCE_UNAVAILABLE, "the hub is down")

    frontier = HashFrontier(on_hashed=lambda n: None, on_reread=lambda n: None, on_complete=lambda: None)
    recheck = Recheck(board, peers, frontier, hub, lambda node, n: None, lambda: False)

    assert recheck.run(f, memoryview(bytearray(64 * KiB))) == {"liar"}
    assert ("liar", 0) in peers.asked  # x's segment was compared with the liar's bytes first, then z's
    assert (tmp_path / "a.bin").read_bytes() == data and f.complete and not f.bad
    assert recheck.bytes <= len(data) + 3 * SEGMENT
