"""A download from several sources at once: fake hubs playing peers (the plugin's peer endpoints, over
TLS, taking this plugin's client certificate) at different speeds, one stopped mid-transfer, one sending
bad bytes, beside the ticket's hub; and the board's decisions on their own."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gpustack_models.local import pki
from gpustack_models.plugin.engine import READY, DownloadSettings
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.ticket import PeerSource
from gpustack_models.plugin.node.agent import peer_fan_out
from gpustack_models.plugin.peers.contract import ClientCertificate
from gpustack_models.plugin.peers.peer_client import PeerAccess, PeerError, parse_tree
from gpustack_models.plugin.peers.swarm import HUB, Board, Finished, SwarmSettings, segment_size
from gpustack_models.sources.manifest import ManifestFile
from tests.fakehub import FakeHub
from tests.plugin.conftest import FAST, KiB, MiB, random_bytes, ticket_for, tree_files, wait_for

ME = "system:gpustack-models-plugin:me"  # the subject of our client certificate
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model-00001.safetensors": random_bytes(3 * MiB + 333, seed=41),
    "model-00002.safetensors": random_bytes(2 * MiB, seed=42),
    "tokenizer.json": random_bytes(40 * KiB, seed=43),
}


@pytest.fixture
def pki_files(tmp_path):
    ca = pki.new_ca("peers test CA")
    ca_crt, _ = ca.write(tmp_path, "ca")
    crt, key = pki.issue(ca, "peer", ip_addresses=("127.0.0.1", "127.0.0.2"), server=True).write(tmp_path, "peer")
    client = pki.issue(ca, ME, client=True).write(tmp_path, "client")
    return str(ca_crt), (crt, key), client


@pytest.fixture
def peers(pki_files):
    """``peers(n)``: ``n`` started fake hubs serving the peer endpoints over TLS (stopped after the test)."""
    started: list[FakeHub] = []

    def start(n: int) -> list[FakeHub]:
        for _ in range(n):
            started.append(FakeHub(tls=pki_files[1], client_ca=pki_files[0], cdn_host=None).start())
        return started[-n:]

    yield start
    for hub in started:
        hub.stop()


@pytest.fixture
def origin(fakehub):
    """The model on the ticket's hub, which counts the bytes it serves."""
    fakehub.lfs_threshold = 64 * MiB  # every file from the hub itself
    commit = fakehub.add_hf_repo("org/fan", FILES)
    fakehub.reset_body_bytes()
    return ticket_for(fakehub, "org/fan", commit)


def with_peers(ticket, hubs, names=None, state="Ready"):
    names = names or [f"peer-{i}" for i in range(len(hubs))]
    return dataclasses.replace(ticket, peers=tuple(PeerSource(n, h.url, state) for n, h in zip(names, hubs)))


def client_tls(pki_files, ca=None) -> ClientCertificate:
    """Our client certificate, checking peers against ``ca`` (the peers' CA by default)."""
    return ClientCertificate(*pki_files[2], ca or pki_files[0])


def engine_with_peers(make_engine, pki_files, ca=None, **swarm):
    access = PeerAccess(tls=client_tls(pki_files, ca))
    return make_engine(settings=DownloadSettings(**FAST), fan_out=peer_fan_out("me", access, SwarmSettings(**swarm)))


def served(hub) -> int:
    return hub.body_bytes


def test_it_takes_everything_from_ready_peers_the_fastest_most_and_asks_the_hub_nothing(
    fakehub, origin, peers, pki_files, make_engine
):
    slow, fast = peers(2)
    for hub in (slow, fast):
        hub.serve_peer(origin.hex, FILES, client=ME)
    slow.faults.throttle("/peer/v1/", 300 * KiB)
    engine = engine_with_peers(make_engine, pki_files)

    engine.ensure(with_peers(origin, [slow, fast]))
    entry = engine.wait(origin.digest, timeout=60)

    assert entry.state == READY and entry.source == "Peer", entry
    assert tree_files(engine.path(origin.digest)) == FILES
    assert served(fakehub) == 0
    by_source = engine.stats(origin.digest)["by_source"]
    assert by_source["hub"] == 0 and sum(by_source.values()) == sum(len(b) for b in FILES.values())
    assert by_source["peer-1"] > 2 * by_source.get("peer-0", 0), by_source


def test_a_peer_stopped_mid_transfer_does_not_stop_the_download(fakehub, origin, peers, pki_files, make_engine):
    doomed, steady = peers(2)
    for hub in (doomed, steady):
        hub.serve_peer(origin.hex, FILES, client=ME)
    doomed.faults.throttle("/peer/v1/", 200 * KiB)
    steady.faults.throttle("/peer/v1/", 1 * MiB)
    engine = engine_with_peers(make_engine, pki_files)

    engine.ensure(with_peers(origin, [doomed, steady]))
    time.sleep(1.0)
    assert doomed.body_bytes > 0 and engine.entry(origin.digest).state == "Downloading"  # serving, mid-way
    doomed.stop()
    entry = engine.wait(origin.digest, timeout=60)

    assert entry.state == READY, entry
    assert tree_files(engine.path(origin.digest)) == FILES
    assert served(fakehub) == 0  # the other peer held everything: the hub gave nothing


def test_a_peer_sending_bad_bytes_is_banned_and_nothing_bad_is_published(
    fakehub, origin, peers, pki_files, make_engine
):
    (liar,) = peers(1)
    liar.serve_peer(origin.hex, FILES, client=ME)
    liar.faults.corrupt("model-00002", times=None)  # every range of that file, one byte flipped
    engine = engine_with_peers(make_engine, pki_files)

    engine.ensure(with_peers(origin, [liar], names=["liar"]))
    entry = engine.wait(origin.digest, timeout=60)

    assert entry.state == READY, entry
    assert tree_files(engine.path(origin.digest)) == FILES
    stats = engine.stats(origin.digest)
    assert stats["banned"] == ["liar"] and stats["banned_peers"] == 1
    # Once banned, what was left came from the hub: at least the bad file, never the whole model twice.
    assert len(FILES["model-00002.safetensors"]) <= served(fakehub) < sum(len(b) for b in FILES.values())


def test_a_peer_refusing_our_certificate_or_lying_about_its_ranges_leaves_the_hub(
    fakehub, origin, peers, pki_files, make_engine
):
    refusing, lying = peers(2)
    refusing.serve_peer(origin.hex, FILES, client="system:gpustack-models-plugin:another")  # 401 to us
    lying.serve_peer(origin.hex, FILES, client=ME, have={p: [(0, 1)] for p in FILES})  # 416 past byte 0
    engine = engine_with_peers(make_engine, pki_files)

    engine.ensure(with_peers(origin, [refusing, lying]))
    entry = engine.wait(origin.digest, timeout=60)

    assert entry.state == READY and entry.source == "Hub", entry
    assert tree_files(engine.path(origin.digest)) == FILES
    assert served(fakehub) == sum(len(b) for b in FILES.values())


def test_a_peer_with_an_untrusted_certificate_gets_no_request(fakehub, origin, peers, pki_files, tmp_path, make_engine):
    (stranger,) = peers(1)
    stranger.serve_peer(origin.hex, FILES)
    other_ca = pki.new_ca("another CA")
    other_crt, _ = other_ca.write(tmp_path / "other", "ca")
    engine = engine_with_peers(make_engine, pki_files, ca=str(other_crt))

    engine.ensure(with_peers(origin, [stranger]))
    entry = engine.wait(origin.digest, timeout=60)

    assert entry.state == READY and entry.source == "Hub", entry
    assert stranger.requests == []  # no request got past the handshake


# ------------------------------------------------------------------------------------------------ the board


def progress(path: str, size: int, tmp_path) -> FileProgress:
    f = FileProgress(ManifestFile(path, size, "sha256", "0" * 64, True), tmp_path / path.replace("/", "_"))
    f.new_hash()
    return f


def test_eight_nodes_split_the_hub_share_between_them(tmp_path):
    files = [progress("a.bin", 64 * MiB, tmp_path), progress("b.bin", 32 * MiB, tmp_path)]
    names = [f"node-{i}" for i in range(8)]
    shares = []
    for me in names:
        board = Board(me, "sha256:" + "a" * 64, files, SwarmSettings(), 16 * MiB)
        board.set_peers(PeerSource(n, "https://127.0.0.1:1", "Downloading") for n in names)
        hub = {id(seg) for seg in board.pending if board._hub_ok(seg, time.monotonic())}
        shares.append({(seg.f.file.path, seg.index) for seg in board.pending if id(seg) in hub})
    total = len(board.pending)
    assert sum(len(s) for s in shares) == total  # every segment has exactly one owner
    assert set().union(*shares) == {(seg.f.file.path, seg.index) for seg in board.pending}
    assert all(total / 8 / 2 < len(s) < total / 8 * 2 for s in shares), [len(s) for s in shares]


def test_a_dead_peers_share_moves_to_the_others_and_a_holder_is_preferred_to_the_hub(tmp_path):
    f = progress("a.bin", 16 * MiB, tmp_path)
    board = Board("me", "sha256:" + "b" * 64, [f], SwarmSettings(hub_floor=0), 16 * MiB)
    board.set_peers([PeerSource("p1", "https://127.0.0.1:1", "Downloading")])
    mine = sum(board._hub_ok(seg, time.monotonic()) for seg in board.pending)
    assert 0 < mine < len(board.pending)
    board.peer_failed("p1")
    board.peer_failed("p1")  # twice: dead
    board.take()  # the owners are worked out again
    assert all(board._hub_ok(seg, time.monotonic()) for seg in board.pending)
    first = board.pending[0]
    board.peers["p1"].dead = False
    board.polled("p1", "Downloading", {"a.bin": [(0, first.end)]})
    seg, source = board.take()
    assert (seg, source) == (first, "p1")


def test_a_straggler_s_tail_goes_to_another_source_without_overlap(tmp_path):
    f = progress("a.bin", 256 * KiB, tmp_path)  # one segment
    board = Board("me", "sha256:" + "c" * 64, [f], SwarmSettings(straggle_seconds=0.0, hub_floor=0), 1 * MiB)
    board.set_peers([PeerSource(n, "https://127.0.0.1:1", "Ready") for n in ("slow", "fast")])
    board.peers["slow"].bytes, board.peers["slow"].busy_seconds = 1 * MiB, 100.0  # 10 KiB/s
    board.peers["fast"].bytes, board.peers["fast"].busy_seconds = 100 * MiB, 1.0
    board.peers["fast"].active = board.settings.peer_connections  # busy: the slow one gets the segment
    slow_seg, source = board.take()
    assert source == "slow" and board.take() is None  # nothing else to do yet: too early to call it slow
    board.peers["fast"].active = 0
    slow_seg.started -= 10
    slow_seg.pos += 64 * KiB
    tail, source = board.take()
    assert source == "fast" and (tail.start, tail.end) == (128 * KiB, 256 * KiB) and slow_seg.end == 128 * KiB
    assert slow_seg.pos < slow_seg.end  # the slow one keeps its head, up to the cut
    board.done(slow_seg, 0, 0.0)
    board.done(tail, 0, 0.0)
    with pytest.raises(Finished):
        board.take()


def test_the_hub_is_asked_only_once_owned_segments_wait_and_after_the_bound(tmp_path):
    f = progress("a.bin", 1 * MiB, tmp_path)
    board = Board("me", "sha256:" + "d" * 64, [f], SwarmSettings(peer_wait=0.2, hub_floor=0), 16 * MiB)
    board.set_peers([PeerSource(f"p{i}", "https://127.0.0.1:1", "Downloading") for i in range(30)])
    not_mine = [seg for seg in board.pending if not board._hub_ok(seg, time.monotonic())]
    assert not_mine  # with 31 nodes, most segments belong to others
    time.sleep(0.25)
    assert all(board._hub_ok(seg, time.monotonic()) for seg in board.pending)  # waited past the bound
    assert board.take()[1] == HUB


def test_segments_are_about_a_256th_of_the_model_within_bounds():
    most = SwarmSettings().max_segments
    assert segment_size(10 * MiB, 16 * MiB, most) == 256 * KiB
    assert segment_size(100 * 1024 * MiB, 16 * MiB, most) == 16 * MiB
    assert segment_size(1024 * MiB, 16 * MiB, most) == 4 * MiB


def test_consecutive_segments_a_measured_peer_holds_go_in_one_request_cut_again_when_put_back(tmp_path):
    f = progress("a.bin", 64 * MiB, tmp_path)
    board = Board("me", "sha256:" + "e" * 64, [f], SwarmSettings(hub_floor=0), 16 * MiB)
    board.set_peers([PeerSource(n, "https://127.0.0.1:1", "Ready") for n in ("new", "fast", "slow")])
    size = board.size
    assert size == 256 * KiB and len(board.pending) == 256
    board.peers["fast"].active = board.peers["slow"].active = board.settings.peer_connections
    seg, source = board.take()  # an untried peer: one segment, until it shows its speed
    assert source == "new" and (seg.start, seg.end) == (0, size)
    board.peers["new"].active = board.settings.peer_connections
    board.peers["fast"].active, board.peers["fast"].bytes, board.peers["fast"].busy_seconds = 0, 100 * MiB, 1.0
    seg, source = board.take()  # 100 MiB/s: half a second is more than the 4 MiB a request may reach
    assert source == "fast" and (seg.start, seg.end) == (size, size + 4 * MiB)
    assert board.pending[0].start == size + 4 * MiB  # the joined segments left the queue
    board.peers["fast"].active = board.settings.peer_connections
    board.peers["slow"].active, board.peers["slow"].bytes, board.peers["slow"].busy_seconds = 0, 1 * MiB, 1.0
    slow, source = board.take()  # 1 MiB/s: half a second of it, two segments
    assert source == "slow" and (slow.start, slow.end) == (size + 4 * MiB, size + 4 * MiB + 2 * size)
    seg.pos = size + MiB + 100  # the fast peer failed part-way: its remainder waits, on segment boundaries
    board.put_back(seg, MiB + 100, 0.1)
    back = [(s.start, s.end, s.index) for s in board.pending if s.start < size + 4 * MiB]
    assert back[0] == (size + MiB + 100, 2 * size + MiB, (size + MiB) // size)
    assert [b[1] - b[0] for b in back[1:]] == [size] * (len(back) - 1) and back[-1][1] == size + 4 * MiB
    assert all(start // size == index for start, _, index in back)


def test_a_peer_s_new_ranges_are_seen_by_the_next_take(tmp_path):
    f = progress("a.bin", 4 * MiB, tmp_path)
    board = Board("me", "sha256:" + "f" * 64, [f], SwarmSettings(hub_floor=0, peer_wait=3600), 16 * MiB)
    board.set_peers([PeerSource(f"p{i}", "https://127.0.0.1:1", "Downloading") for i in range(40)])
    waiting = [s for s in board.pending if not board._hub_ok(s, time.monotonic())]
    last = waiting[-1]
    while (choice := board.take()) is not None:  # our own share from the hub: the rest waits for holders
        assert choice[1] == HUB
    board.polled("p7", "Downloading", {"a.bin": [(last.start, last.end)]})
    assert board.take() == (last, "p7")


def test_tree_answers_are_bounded_to_the_manifest():
    sizes = {"a": 100, "b": 50}
    state, files = parse_tree(
        {
            "state": "Ready",
            "files": [
                {"path": "a", "have": [[0, 1000], [-5, 3], [7, 7], ["x", 1]]},
                {"path": "../etc/passwd", "have": [[0, 10]]},
                {"path": "b", "have": [[0, 50]]},
            ],
        },
        sizes,
    )
    assert files == {"a": [(0, 100)], "b": [(0, 50)]}
    assert state == "Ready"
    state, files = parse_tree({"state": "Ready", "files": [{"path": "a", "have": [[0, 10]]}]}, sizes)
    assert state == "Downloading"  # a Ready peer listing less is trusted for what it lists only
    with pytest.raises(PeerError):
        parse_tree({"files": "nope"}, sizes)


def test_a_lone_download_takes_the_hubs_parts_until_a_peer_shows_up_then_the_rest_from_it(
    fakehub, origin, peers, pki_files, make_engine
):
    (late,) = peers(1)
    late.serve_peer(origin.hex, FILES, client=ME)
    fakehub.total_rate = 1 * MiB  # about five seconds for the model from the hub alone
    listed: list[PeerSource] = []
    alone = dataclasses.replace(origin, joining=0)  # no other node wants it yet: nobody to wait for

    def refresh(digest):
        return dataclasses.replace(alone, peers=tuple(listed))

    access = PeerAccess(tls=client_tls(pki_files), refresh=refresh)
    swarm = SwarmSettings(peer_refresh=0.2, peer_poll=0.1)
    engine = make_engine(settings=DownloadSettings(**FAST), fan_out=peer_fan_out("me", access, swarm))

    engine.ensure(alone)  # no peer in the ticket
    wait_for(lambda: served(fakehub) > 0, timeout=10)
    assert served(fakehub) < sum(len(b) for b in FILES.values()) / 3  # the hub's parts, under way
    listed.append(PeerSource("late", late.url, "Ready"))
    entry = engine.wait(origin.digest, timeout=60)

    assert entry.state == READY and entry.source == "Peer", entry
    assert tree_files(engine.path(origin.digest)) == FILES
    size = sum(len(b) for b in FILES.values())
    assert served(fakehub) < size / 2 and late.body_bytes > size / 2


def test_a_node_alone_asks_the_hub_at_once(fakehub, origin, pki_files, make_engine):
    alone = dataclasses.replace(origin, joining=0)
    access = PeerAccess(tls=client_tls(pki_files), refresh=lambda digest: alone)
    swarm = SwarmSettings(peer_settle=60.0)  # a wait for peers would outlast the test
    engine = make_engine(settings=DownloadSettings(**FAST), fan_out=peer_fan_out("me", access, swarm))

    engine.ensure(alone)
    entry = engine.wait(origin.digest, timeout=30)

    assert entry.state == READY and entry.source == "Hub", entry
    assert served(fakehub) == sum(len(b) for b in FILES.values())


@pytest.mark.parametrize("joining", [1, None], ids=["nodes-joining", "worker-does-not-say"])
def test_the_hub_waits_for_nodes_still_joining_and_not_once_none_is(joining, fakehub, origin, pki_files, make_engine):
    said = {"joining": joining}
    asked = []

    def refresh(digest):
        asked.append(time.monotonic())
        return dataclasses.replace(origin, joining=said["joining"])

    access = PeerAccess(tls=client_tls(pki_files), refresh=refresh)
    swarm = SwarmSettings(peer_settle=60.0, peer_poll=0.1, peer_refresh=5.0)
    engine = make_engine(settings=DownloadSettings(**FAST), fan_out=peer_fan_out("me", access, swarm))

    engine.ensure(dataclasses.replace(origin, joining=joining))
    wait_for(lambda: len(asked) >= 5, timeout=10)  # the ticket asked for again at every poll meanwhile
    assert served(fakehub) == 0 and not [r for r in fakehub.requests if r.method == "GET"]
    assert engine.entry(origin.digest).state == "Downloading"
    said["joining"] = 0  # the last one was placed (or left out): nobody left to wait for
    entry = engine.wait(origin.digest, timeout=30)  # long before the settle's 60 s

    assert entry.state == READY and entry.source == "Hub", entry
    assert served(fakehub) == sum(len(b) for b in FILES.values())
