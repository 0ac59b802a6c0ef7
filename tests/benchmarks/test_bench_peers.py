"""A plugin's peer endpoints serving a Ready tree: the whole big file read over one connection and as
parallel ranges over four, against reading it from the fake hub, unthrottled (both on this machine)."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.test_peers import WEIGHTS, Peer, peer_cert
from tests.test_plugins import Scenario, big_files


@pytest.fixture
def scenario(worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin):
    yield Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    hub.faults.clear()


def read_ranges(peer, cert, size, connections) -> float:
    """MB/s reading ``size`` bytes of the big file as ``connections`` ranges at once (bytes checked by length)."""
    step = -(-size // connections)
    spans = [(s, min(size, s + step)) for s in range(0, size, step)]

    def one(span):
        got = peer.file(WEIGHTS, cert, f"bytes={span[0]}-{span[1] - 1}")
        assert got.status_code == 206 and len(got.content) == span[1] - span[0]

    started = time.monotonic()
    with ThreadPoolExecutor(connections) as pool:
        list(pool.map(one, spans))
    return size / (time.monotonic() - started) / 1e6


def test_bench_peer_serving(bench_scale, record, scenario, hub, launcher):
    mb = 256 if bench_scale == "full" else 3
    scenario.artifact(files=big_files(scenario.repo, mb=mb))
    a, b = scenario.plugins(2)
    scenario.prefetch([a, b])
    scenario.wait_state(a.node, "Ready", timeout=300)
    scenario.wait_state(b.node, "Ready", timeout=300)
    peer, cert = Peer(a, launcher, scenario.digest), peer_cert(b)
    size = len(scenario.files[WEIGHTS])
    session = requests.Session()
    session.trust_env = False
    started = time.monotonic()
    from_hub = session.get(f"{hub.url}/{scenario.repo}/resolve/main/{WEIGHTS}", timeout=300)
    hub_mb_s = size / (time.monotonic() - started) / 1e6
    assert from_hub.status_code == 200 and len(from_hub.content) == size
    one, four = read_ranges(peer, cert, size, 1), read_ranges(peer, cert, size, 4)
    assert one > 0 and four > 0 and hub_mb_s > 0
    record(
        f"peer serving of a {size / 1e6:.0f} MB file (TLS, node-wide limits off): one connection {one:.1f} MB/s,"
        f" four ranges {four:.1f} MB/s; the fake hub over plain HTTP {hub_mb_s:.1f} MB/s"
    )
