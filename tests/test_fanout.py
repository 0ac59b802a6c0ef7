"""Peer fan-out with real node plugins: eight nodes prefetch one model from a hub throttled to a fixed total
rate; every node ends Ready with byte-identical files while the hub serves about one copy; a peer killed
mid-transfer and a peer serving a corrupted file stop nobody (the corrupted one is banned, nothing bad is
published)."""

from __future__ import annotations

import hashlib
import re
import time

import pytest
import requests

from tests.support import TEST_STATE, wait_for
from tests.test_plugins import Scenario

MiB = 1024 * 1024


def model(seed: str, mb: int) -> dict[str, bytes]:
    """Incompressible files: two weights shards, a config and a tokenizer."""

    def block(tag: str, size: int) -> bytes:
        out = bytearray()
        counter = 0
        while len(out) < size:
            out += hashlib.sha256(f"{seed}:{tag}:{counter}".encode()).digest() * 128
            counter += 1
        return bytes(out[:size])

    return {
        "config.json": f'{{"model": "{seed}"}}'.encode(),
        "model-00001-of-00002.safetensors": block("a", mb * MiB * 2 // 3),
        "model-00002-of-00002.safetensors": block("b", mb * MiB // 3 + 12345),
        "tokenizer.json": block("t", 200_000),
    }


@pytest.fixture
def fan(worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin):
    scenario = Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    yield scenario
    hub.total_rate = 0
    hub.faults.clear()


def size_of(files: dict[str, bytes]) -> int:
    return sum(len(b) for b in files.values())


def identical(scenario, plugin) -> bool:
    tree = scenario.tree(plugin)
    return all((tree / path).read_bytes() == data for path, data in scenario.files.items())


def log_of(plugin) -> str:
    return (TEST_STATE / f"plugin-{plugin.node}.log").read_text(errors="replace")


def source_bytes(plugin) -> dict[tuple[str, str], float]:
    """The plugin's ``received_bytes_total`` counters by ``(source, peer)``."""
    s = requests.Session()
    s.trust_env = False
    text = s.get(f"{plugin.url}/metrics", verify=False, timeout=5).text
    out = {}
    pattern = r'gpustack_models_plugin_received_bytes_total\{peer="([^"]*)",source="([^"]*)"\} (\S+)'
    for peer, source, value in re.findall(pattern, text):
        out[(source, peer)] = float(value)
    return out


def all_ready(scenario, plugins, timeout):
    for p in plugins:
        scenario.wait_state(p.node, "Ready", timeout=timeout)


def test_eight_nodes_take_about_one_copy_from_a_throttled_hub(fan, hub):
    files = model(fan.repo, 24)
    size = size_of(files)
    fan.artifact(files=files)
    plugins = fan.plugins(8)
    hub.total_rate = 3 * MiB  # the hub alone would need 8 copies: about a minute
    hub.reset_body_bytes()
    started = time.monotonic()
    fan.prefetch(plugins)
    all_ready(fan, plugins, timeout=60)
    elapsed = time.monotonic() - started

    assert all(identical(fan, p) for p in plugins)
    # Nodes placed together know each other from their first ticket: the hub serves about one copy.
    assert hub.body_bytes <= 1.1 * size, f"the hub served {hub.body_bytes / size:.2f} copies"
    assert elapsed < 8 * size / hub.total_rate / 2  # well under what eight copies from the hub take
    sources = [fan.entry(p.node)["source"] for p in plugins]
    assert sources.count("Peer") >= 6, sources  # most nodes took most bytes from peers
    counters = [source_bytes(p) for p in plugins]
    from_peers = sum(v for c in counters for (kind, _), v in c.items() if kind == "peer")
    assert from_peers >= 6 * size, counters
    assert any("bytes by source: hub" in log_of(p) and ", peers " in log_of(p) for p in plugins)


def test_a_killed_peer_and_a_corrupted_peer_stop_nobody(fan, hub):
    files = model(fan.repo, 16)
    size = size_of(files)
    fan.artifact(files=files)
    (seed,) = fan.plugins(1)
    fan.prefetch([seed], name="seed")
    fan.wait_state(seed.node, "Ready", timeout=60)
    # The seed's copy goes bad on its disk: it serves one flipped byte in the smaller shard.
    shard = fan.tree(seed) / "model-00002-of-00002.safetensors"
    shard.chmod(0o644)
    with shard.open("r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))

    others = fan.plugins(6)
    hub.total_rate = 2 * MiB
    hub.reset_body_bytes()
    fan.prefetch(others, name="rest")
    victim = others[0]
    wait_for(
        lambda: (e := fan.entry(victim.node)) and e["state"] == "Downloading" and e.get("downloadedBytes", 0) > 0,
        timeout=30,
        message="the victim to be mid-transfer",
    )
    victim.stop(kill=True)
    survivors = others[1:]
    all_ready(fan, survivors, timeout=90)

    assert all(identical(fan, p) for p in survivors)
    banned = [p for p in survivors if re.search(rf"banned peer {re.escape(seed.node)} ", log_of(p))]
    assert banned, "no node banned the corrupted peer"
    # The good shard comes from the seed. The corrupted one may reach a node from a peer that relayed the
    # seed's bytes before its own check failed, so that peer is banned too and in the worst case every node
    # takes that file from the hub: at most one such file per node, plus half a copy of slack for
    # stragglers re-cut to the hub, still well under the six copies the hub alone would serve.
    corrupted = len(fan.files["model-00002-of-00002.safetensors"])
    bound = len(others) * corrupted + size // 2
    assert hub.body_bytes <= bound, f"the hub served {hub.body_bytes / size:.2f} copies (bound {bound / size:.2f})"
