"""Peer fan-out with real node plugins: eight nodes prefetch one model from a hub throttled to a fixed total
rate; every node ends Ready with byte-identical files while the hub serves about one copy; a peer killed
mid-transfer and a peer serving a corrupted file stop nobody (the corrupted one is banned, nothing bad is
published, honest peers stay usable)."""

from __future__ import annotations

import hashlib
import re
import time

import pytest
import requests

from gpustack_models.kinds import GROUP
from tests.support import TEST_STATE, wait_for
from tests.support.uploads import annotate, plugin_metric
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
    files = model(fan.repo, 12)
    size = size_of(files)
    fan.artifact(files=files)
    plugins = fan.plugins(8)
    hub.total_rate = 3 * MiB  # the hub alone would need 8 copies: about half a minute
    hub.reset_body_bytes()
    started = time.monotonic()
    fan.prefetch(plugins)
    all_ready(fan, plugins, timeout=60)
    elapsed = time.monotonic() - started

    assert all(identical(fan, p) for p in plugins)
    # Nodes placed together know each other from their first ticket, or wait for the worker to place the
    # digest on the others before asking the hub (``joining``): the hub serves about one copy.
    assert hub.body_bytes <= 1.1 * size, f"the hub served {hub.body_bytes / size:.2f} copies"
    assert elapsed < 8 * size / hub.total_rate / 2  # well under what eight copies from the hub take
    sources = [fan.entry(p.node)["source"] for p in plugins]
    assert sources.count("Peer") >= 6, sources  # most nodes took most bytes from peers
    counters = [source_bytes(p) for p in plugins]
    from_peers = sum(v for c in counters for (kind, _), v in c.items() if kind == "peer")
    assert from_peers >= 6 * size, counters
    assert any("bytes by source: hub" in log_of(p) and ", peers " in log_of(p) for p in plugins)


def served_bytes(plugin) -> float:
    """What the plugin's peer endpoints served, to every node."""
    s = requests.Session()
    s.trust_env = False
    text = s.get(f"{plugin.url}/metrics", verify=False, timeout=5).text
    pattern = r'gpustack_models_plugin_peer_served_bytes_total\{peer="[^"]*"\} (\S+)'
    return sum(float(v) for v in re.findall(pattern, text))


def download_of(plugin, digest: str) -> dict:
    """What the plugin's log says of its download of ``digest``: each time a file failed its hash
    (``failures``: its path, the bytes the download still needed then and when, in order), the bytes read
    again to re-check such files (``rechecked``), how many were thrown away because the re-check could not
    tell whose bytes were bad (``thrown``), the bytes fetched in all and those from the hub (``None`` until it
    finished)."""
    text, short = log_of(plugin), re.escape(digest[:19])
    failure = (
        rf"^(\S+ \S+) WARNING \S+: {short}: (\S+) failed its hash with bytes from .*? \((\d+) bytes left to fetch\)$"
    )
    failures = [(path, int(left), logged) for logged, path, left in re.findall(failure, text, re.M)]
    outcome = rf"{short}: \S+ (?:verifies with the bytes of .*? replaced \(|could not be re-checked \(.*?; )(\d+) bytes"
    thrown = rf"{short}: \S+ could not be re-checked "
    done = re.search(rf"download {short} ready: (\d+) bytes fetched .* bytes by source: hub (\d+)", text)
    return {
        "failures": failures,
        "rechecked": sum(int(n) for n in re.findall(outcome, text)),
        "thrown": len(re.findall(thrown, text)),
        "fetched": int(done.group(1)) if done else None,
        "hub": int(done.group(2)) if done else None,
    }


def logged_at(logged: str) -> float:
    """A log line's time (local, to the millisecond, as ``logging`` writes it) in seconds since the epoch."""
    return time.mktime(time.strptime(logged[:19], "%Y-%m-%d %H:%M:%S")) + int(logged[20:23]) / 1000


def test_a_killed_peer_and_a_corrupted_peer_stop_nobody(fan, hub, core):
    files = model(fan.repo, 16)
    size = size_of(files)
    fan.artifact(files=files)
    seed, *others = fan.plugins(7)  # started together: the seed alone wants the model first
    fan.prefetch([seed], name="seed")
    victim = others[0]
    # The victim downloads at 2 MB/s (its Node's annotation): several seconds, so it is still downloading
    # when it has served other nodes and is killed.
    annotate(core, victim.node, {f"{GROUP}/download-bytes-per-second": "2000000"})
    wait_for(
        lambda: plugin_metric(victim, "gpustack_models_plugin_download_rate_limit_bytes_per_second") == 2_000_000,
        timeout=30,
        message="the victim's download rate limit",
    )
    # The seed serves 2 MB/s in all (its Node's annotation), so the others take much of the model from each
    # other, the victim included, rather than all of it from the seed before the victim holds anything.
    annotate(core, seed.node, {f"{GROUP}/upload-bytes-per-second": "2000000"})
    wait_for(
        lambda: plugin_metric(seed, "gpustack_models_plugin_peer_upload_rate_limit_bytes_per_second") == 2_000_000,
        timeout=30,
        message="the seed's upload rate limit",
    )
    fan.wait_state(seed.node, "Ready", timeout=60)
    # The seed's copy goes bad on its disk: it serves one flipped byte in the smaller shard.
    bad = "model-00002-of-00002.safetensors"
    shard = fan.tree(seed) / bad
    shard.chmod(0o644)
    with shard.open("r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))

    hub.reset_body_bytes()
    since = len(hub.requests)
    fan.prefetch(others, name="rest")
    # Killed once it has served other nodes: they lose a source they were using.
    wait_for(lambda: served_bytes(victim) > 0, timeout=60, interval=0.05, message="the victim to serve other nodes")
    victim_hub = source_bytes(victim).get(("hub", ""), 0.0)
    victim.stop(kill=True)
    assert not re.search(rf"download {re.escape(fan.digest[:19])} ready", log_of(victim)), "not killed mid-transfer"
    survivors = others[1:]
    all_ready(fan, survivors, timeout=90)

    assert all(identical(fan, p) for p in survivors)
    banned = [p for p in survivors if re.search(rf"banned peer {re.escape(seed.node)} ", log_of(p))]
    assert banned, "no node banned the corrupted peer"
    assert any(source_bytes(p).get(("peer", victim.node), 0) > 0 for p in survivors), "nobody kept the victim's bytes"

    # The hub's share, from what was injected. The seed is Ready (it holds every byte) and stays up, and
    # a node asks the hub only for what no peer it has not banned holds: nothing is asked of the hub until
    # a node first finds the bad shard (it logs that before it re-checks it or bans anyone). A node finds
    # the shard bad k times (k >= 0: its bytes came from the seed, or from a peer that relayed the seed's
    # bytes before its own check failed). Each time, it reads the ranges peers wrote once more from a
    # second source (``rechecked`` bytes in all, from the hub while it serves) and bans only the peers whose
    # bytes differ; only when that cannot tell is the shard thrown away and fetched again (``thrown``
    # times), and nothing else is ever thrown away: it fetches exactly size + rechecked + thrown * shard
    # bytes. After its first failure it may ask the hub for what it still needed then (``left``: the bytes
    # of other files it did not have yet), for the re-checks, and for the shard after each throw: at most
    # left + rechecked + thrown * shard bytes from the hub, and none if k == 0. The victim's share is the
    # same, counted up to its death.
    shard_size = len(files[bad])
    downloads = {p.node: download_of(p, fan.digest) for p in others}
    bounds = {}
    for p in others:
        d = downloads[p.node]
        assert all(path == bad for path, _, _ in d["failures"]), d
        k = len(d["failures"])
        bounds[p.node] = d["failures"][0][1] + d["rechecked"] + d["thrown"] * shard_size if k else 0
        if p is victim:
            assert victim_hub <= bounds[p.node], (victim_hub, d)
            continue
        assert d["fetched"] == size + d["rechecked"] + d["thrown"] * shard_size, (p.node, d, shard_size)
        # The hub serving, every re-check tells whose bytes were bad: no shard is thrown away.
        assert d["thrown"] == 0, (p.node, d)
        assert source_bytes(p).get(("hub", ""), 0.0) == d["hub"] <= bounds[p.node], (p.node, d, bounds[p.node])
    failures = [logged_at(when) for d in downloads.values() for _, _, when in d["failures"]]
    asked = [r for r in hub.requests[since:] if r.listener == "cdn" or "/resolve/" in r.path]
    early = [r for r in asked if not failures or r.started < min(failures)]
    assert not early, f"the hub was asked before any node found the bad shard: {early[:3]}"
    # The nodes count what they received from the hub; the hub may have handed a socket a few more bytes
    # of a request cut short, never fewer.
    received = victim_hub + sum(downloads[p.node]["hub"] for p in survivors)
    assert received <= hub.body_bytes, (received, hub.body_bytes)
