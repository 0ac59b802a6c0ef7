"""Real node plugins (``manage.py runplugin``) with the worker, the control plane and the fake hub:
download, verify, publish, report, and the live ``progress`` subresource."""

import hashlib
import itertools
import json
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import requests

from gpustack_models import kube
from gpustack_models.kinds import GROUP
from gpustack_models.plugin.cache import read_json
from tests.support import PLUGIN_PORT, kube_update, read_modify_write, token_http, wait_for

STORAGE = f"/apis/{GROUP}/v1alpha1"
_addresses = (f"127.0.1.{i}" for i in itertools.count(10))


def big_files(seed: str, mb: int = 3) -> dict[str, bytes]:
    block = hashlib.sha256(seed.encode()).digest() * 32768  # 1 MiB
    return {
        "config.json": json.dumps({"model": seed}).encode(),
        "model.safetensors": block * mb,
        "tokenizer.json": (seed * 100).encode(),
    }


class Scenario:
    """An artifact on the fake hub, resolved in a namespace, prefetched to some nodes."""

    def __init__(self, hub, worker_kube, admin_http, cluster, namespace, start_plugin):
        self.hub, self.kube, self.admin, self.cluster, self.ns = hub, worker_kube, admin_http, cluster, namespace
        self.start_plugin = start_plugin
        self.repo = f"org/p-{uuid.uuid4().hex[:6]}"
        self.files: dict[str, bytes] = {}

    def artifact(self, name="art", files=None, ns=None):
        if not self.files:
            self.files = files or big_files(self.repo)
            self.hub.add_hf_repo(self.repo, self.files)
        ns = ns or self.ns
        self.kube.create(
            f"{STORAGE}/namespaces/{ns}/modelartifacts",
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "ModelArtifact",
                "metadata": {"name": name},
                "spec": {"source": {"huggingFace": {"repository": self.repo}}},
            },
        )

        def digest():
            obj = self.kube.get(f"{STORAGE}/namespaces/{ns}/modelartifacts/{name}")
            return (obj.get("status") or {}).get("resolved", {}).get("manifestDigest")

        self.digest = wait_for(digest, timeout=60, message="the artifact to resolve")
        return self.digest

    @property
    def weights(self) -> str:
        """How the hub's CDN names the big file (its sha256): the match for faults and the request log."""
        return hashlib.sha256(self.files["model.safetensors"]).hexdigest()

    def plugins(self, count, **env):
        env.setdefault("GPUSTACK_PLUGIN_RETRY_BASE", "3")
        return [self.start_plugin(f"node-{uuid.uuid4().hex[:5]}", next(_addresses), **env) for _ in range(count)]

    def prefetch(self, nodes, name="warm"):
        self.kube.create(
            f"{STORAGE}/namespaces/{self.ns}/modelprefetches",
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "ModelPrefetch",
                "metadata": {"name": name},
                "spec": {"artifactRef": {"name": "art"}, "nodeNames": [p.node for p in nodes]},
            },
        )

    def entry(self, node):
        try:
            store = self.kube.get(f"{STORAGE}/nodemodelstores/{node}")
        except kube.NotFound:
            return None
        for model in (store.get("status") or {}).get("models") or []:
            if model["digest"] == self.digest:
                return model
        return None

    def wait_state(self, node, state, timeout=90, reason=None):
        def check():
            e = self.entry(node)
            return e if e and e["state"] == state and (reason is None or e.get("reason") == reason) else None

        return wait_for(check, timeout=timeout, interval=0.3, message=f"{node} to be {state} {reason or ''}")

    def progress(self, name="art", ns=None):
        url = f"{self.cluster.server}/apis/{GROUP}/v1/namespaces/{ns or self.ns}/modelartifacts/{name}/progress"
        resp = self.admin.get(url)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def tree(self, plugin) -> Path:
        return plugin.cache / "models" / self.digest.split(":", 1)[1]


@pytest.fixture
def scenario(worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin):
    yield Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    hub.faults.clear()


def test_it_downloads_to_three_nodes_with_live_progress(scenario, hub, kubectl, core, worker_kube):
    from kubernetes import client as k8s

    scenario.artifact(files=big_files(scenario.repo, mb=8))
    plugins = scenario.plugins(3)
    hub.faults.throttle(scenario.weights, 600_000)  # ~14 s: slow enough to watch (bytes land a MiB at a time)
    scenario.prefetch(plugins)
    for p in plugins:
        scenario.wait_state(p.node, "Downloading", timeout=60)
    first = wait_for(
        lambda: (pr := scenario.progress())["downloading"] == 3 and pr["live"] == 3 and pr,
        timeout=30,
        message="three live downloads",
    )
    assert "downloadingPercent" in first
    second = wait_for(
        lambda: (pr := scenario.progress())["downloadingBytes"] > first["downloadingBytes"] and pr["live"] == 3 and pr,
        timeout=30,
        message="live bytes to move between two answers",
    )
    text = json.dumps(second)
    for p in plugins:
        assert p.node not in text and p.address not in text  # no node in the answer
    # The same content in another namespace answers the same counts.
    other = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=other)))
    try:
        scenario.artifact(name="twin", ns=other)
        twin = scenario.progress("twin", ns=other)
        assert (twin["ready"], twin["downloading"], twin["manifestDigest"]) == (0, 3, scenario.digest)
        hub.faults.clear()
        for p in plugins:
            scenario.wait_state(p.node, "Ready", timeout=120)
        done = scenario.progress()
        assert (done["ready"], done["downloading"], done["live"]) == (3, 0, 0)
        assert "downloadingPercent" not in done
        assert scenario.progress("twin", ns=other)["ready"] == 3
    finally:
        core.delete_namespace(other)
    for p in plugins:
        for path, data in scenario.files.items():
            assert (scenario.tree(p) / path).read_bytes() == data
    listing = kubectl("get", "nms", *[p.node for p in plugins], "-o", "wide").stdout
    rows = {line.split()[0]: line.split() for line in listing.splitlines()[1:]}
    for p in plugins:
        assert rows[p.node][1:4] == ["1", "8.0Mi", "1"]  # READY, USED, MODELS


def test_it_answers_zeros_and_a_reason_for_unresolved_and_claim_artifacts(scenario):
    scenario.kube.create(
        f"{STORAGE}/namespaces/{scenario.ns}/modelartifacts",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": "claim"},
            "spec": {"source": {"persistentVolumeClaim": {"claimName": "models"}}},
        },
    )
    scenario.kube.create(
        f"{STORAGE}/namespaces/{scenario.ns}/modelartifacts",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": "nowhere"},
            "spec": {"source": {"huggingFace": {"repository": "org/does-not-exist"}}},
        },
    )
    claim = scenario.progress("claim")
    assert (claim["ready"], claim["downloading"], claim["live"], claim["reason"]) == (0, 0, 0, "ClaimSource")
    nowhere = scenario.progress("nowhere")
    assert (nowhere["ready"], nowhere["failed"], nowhere["reason"]) == (0, 0, "NotResolved")


def live_bytes(plugin, launcher, digest):
    token = launcher.service_account_token("gpustack-models-worker", seconds=600)
    s = requests.Session()
    s.trust_env = False
    resp = s.get(f"{plugin.url}/model/downloads", verify=False, headers={"Authorization": f"Bearer {token}"})
    return next((d["downloadedBytes"] for d in resp.json()["downloads"] if d["digest"] == digest), 0)


def test_it_resumes_after_a_dropped_connection_and_a_kill(scenario, hub, launcher):
    scenario.artifact(files=big_files(scenario.repo, mb=12))
    size = len(scenario.files["model.safetensors"])
    (plugin,) = scenario.plugins(1)
    hub.faults.drop(scenario.weights, after_bytes=1_500_000)
    hub.faults.throttle(scenario.weights, 500_000)
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Downloading")
    wait_for(
        lambda: live_bytes(plugin, launcher, scenario.digest) >= 4_000_000,
        timeout=60,
        message="the download to pass 4 MB",
    )
    gets = [r for r in hub.requests if scenario.weights in r.path and r.method == "GET" and r.range]
    starts = [int(r.range.split("=")[1].split("-")[0]) for r in gets]
    assert len(starts) >= 2 and 0 < starts[1] <= 1_500_000 + 1 and starts[1] >= 1_000_000, (
        starts
    )  # resumed near the drop
    checkpoint = plugin.cache / "partial" / scenario.digest.split(":", 1)[1] / "checkpoint.json"

    def hashed() -> int:
        return ((read_json(checkpoint) or {}).get("files") or {}).get("model.safetensors", {}).get("hashed") or 0

    wait_for(lambda: hashed() >= 4_000_000, timeout=30, message="a checkpoint past 4 MB")
    plugin.stop(kill=True)
    before = len(hub.requests)
    hub.faults.clear()
    plugin.start()
    scenario.wait_state(plugin.node, "Ready", timeout=120)
    after = [r for r in hub.requests[before:] if scenario.weights in r.path and r.method == "GET"]
    assert after, "the restarted plugin asked nothing (was the file finished before the kill?)"
    resumed = [int(r.range.split("=")[1].split("-")[0]) for r in after if r.range]
    assert resumed and min(resumed) >= 3_500_000, f"the restart asked again from {resumed}"
    assert sum(r.bytes_sent for r in after) <= size - 3_500_000
    assert (scenario.tree(plugin) / "model.safetensors").read_bytes() == scenario.files["model.safetensors"]


def test_it_refuses_corrupt_bytes_and_publishes_nothing(scenario, hub):
    scenario.artifact()
    (plugin,) = scenario.plugins(1)
    hub.faults.corrupt(scenario.weights, offset=1000)
    scenario.prefetch([plugin])
    failed = scenario.wait_state(plugin.node, "Failed", reason="IntegrityMismatch")
    assert failed["retryTime"]
    assert not scenario.tree(plugin).exists()


def test_it_backs_off_hub_errors_across_a_restart_then_succeeds(scenario, hub):
    scenario.artifact()
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_RETRY_BASE=12)
    hub.faults.fail(scenario.repo, 503, times=None)  # the hub's own paths name the repository
    hub.faults.fail(scenario.weights, 429, times=None, retry_after=1)
    scenario.prefetch([plugin])
    failed = scenario.wait_state(plugin.node, "Failed", reason="SourceUnavailable")
    mark = len(hub.requests)
    retry_at = datetime.fromisoformat(failed["retryTime"].replace("Z", "+00:00")).timestamp()
    written = int(scenario.kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}")["metadata"]["resourceVersion"])
    plugin.stop()
    plugin.start()

    def rewritten():  # the restarted plugin writes its status from disk: a newer write than the failure's
        store = scenario.kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}")
        entry = scenario.entry(plugin.node)
        return int(store["metadata"]["resourceVersion"]) > written and entry and entry["state"] == "Failed" and entry

    again = wait_for(rewritten, timeout=30, message="the restarted plugin's status write")
    assert again["retryTime"] == failed["retryTime"] and again["reason"] == "SourceUnavailable"
    assert time.time() < retry_at, "the restart took longer than the backoff: nothing was checked"
    hub.faults.clear()
    scenario.wait_state(plugin.node, "Ready", timeout=90)
    downloads = [
        r for r in hub.requests[mark:] if r.listener == "cdn" or f"/{scenario.repo}/resolve/" in r.path
    ]  # fmt: skip
    assert downloads, "the retry fetched nothing"
    early = [r.target for r in downloads if r.started < retry_at]
    assert early == [], f"asked the hub before retryTime {failed['retryTime']}: {early}"
    assert scenario.entry(plugin.node).get("retryTime") is None


def test_it_refuses_to_start_past_the_high_watermark(scenario, hub):
    scenario.artifact()
    mark = len(hub.requests)
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_CAPACITY_BYTES=2_000_000)
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Failed", reason="InsufficientCapacity")
    assert not scenario.tree(plugin).exists()
    fetched = [r.target for r in hub.requests[mark:] if r.listener == "cdn" or "/resolve/" in r.path]
    assert fetched == [], "a download that cannot fit fetched bytes"


def test_it_restores_a_deleted_store_from_disk_and_collects_after_the_grace(scenario, hub):
    scenario.artifact()
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_GRACE_SECONDS=6)
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Ready", timeout=90)
    before = len(hub.requests)
    scenario.kube.delete(f"{STORAGE}/nodemodelstores/{plugin.node}")
    scenario.wait_state(plugin.node, "Ready", timeout=10)
    assert len(hub.requests) == before, "a recreated store caused hub requests"
    # Out of spec.models: kept through the grace, removed after it.
    scenario.kube.delete(f"{STORAGE}/namespaces/{scenario.ns}/modelprefetches/warm")
    wait_for(
        lambda: (
            not any(
                m["digest"] == scenario.digest
                for m in (scenario.kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}")["spec"].get("models") or [])
            )
        ),
        timeout=30,
        message="the digest to leave spec.models",
    )
    left = time.monotonic()
    wait_for(lambda: not scenario.tree(plugin).exists(), timeout=30, interval=0.1, message="removal after the grace")
    # The grace is the contract: the plugin saw the digest leave after `left`, so it waited at least this long.
    assert time.monotonic() - left >= 6 - 0.2, "removed before the grace"
    wait_for(lambda: scenario.entry(plugin.node) is None, timeout=15, message="the entry to leave the status")


def test_it_guards_tickets_status_and_live_bytes(scenario, cluster, launcher, worker_api):
    scenario.artifact()
    a, b = scenario.plugins(2)
    scenario.prefetch([a])
    scenario.wait_state(a.node, "Ready", timeout=90)
    token_a = launcher_token(a)
    token_b = launcher_token(b)
    tenant = cluster.tokens()["erin"]

    def ticket(token, node, digest):
        s = requests.Session()
        s.trust_env = False
        return s.post(
            f"{worker_api.url}/internal/v1/tickets",
            json={"node": node, "digest": digest},
            headers={"Authorization": f"Bearer {token}"},
            verify=str(worker_api.ca_file),
        )

    assert ticket(token_a, a.node, scenario.digest).status_code == 200
    assert ticket(tenant, a.node, scenario.digest).status_code == 403
    assert ticket(token_b, a.node, scenario.digest).status_code == 403  # another node's plugin
    assert ticket(token_b, b.node, scenario.digest).status_code == 403  # not in b's spec.models
    assert ticket("not-a-token", a.node, scenario.digest).status_code == 401
    # Another node's plugin cannot write this node's status (the admission policy).
    other = token_http(cluster, token_b)

    def emptied(obj):
        obj["status"]["models"] = []
        return obj

    forged = read_modify_write(other, f"{cluster.server}{STORAGE}/nodemodelstores/{a.node}/status", emptied)
    assert forged.status_code == 403, forged.text
    own = read_modify_write(other, f"{cluster.server}{STORAGE}/nodemodelstores/{b.node}/status", emptied)
    assert own.status_code == 200, own.text
    # Live bytes are for the worker alone.
    s = requests.Session()
    s.trust_env = False
    url = f"{a.url}/model/downloads"
    assert s.get(url, verify=False).status_code == 401
    assert s.get(url, verify=False, headers={"Authorization": f"Bearer {tenant}"}).status_code == 403
    assert s.get(url, verify=False, headers={"Authorization": f"Bearer {token_a}"}).status_code == 403
    worker_token = worker_api.launcher.service_account_token("gpustack-models-worker", seconds=600)
    assert s.get(url, verify=False, headers={"Authorization": f"Bearer {worker_token}"}).status_code == 200
    # Nothing on the node side names a tenant.
    text = json.dumps(scenario.kube.get(f"{STORAGE}/nodemodelstores/{a.node}"))
    metrics = s.get(f"{a.url}/metrics", verify=False).text
    for secret in (scenario.ns, scenario.repo, "art", "warm"):
        assert secret not in text.replace(scenario.digest, "") and secret not in metrics


def launcher_token(plugin):
    import yaml

    return yaml.safe_load(Path(plugin.env["KUBECONFIG"]).read_text())["users"][0]["user"]["token"]


def test_it_writes_progress_on_thresholds_and_progress_writes_nothing(scenario, hub, cluster):
    scenario.artifact(files=big_files(scenario.repo, mb=4))
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_PROGRESS_INTERVAL=3)
    hub.faults.throttle(scenario.weights, 250_000)  # ~16 s: several progress intervals
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Ready", timeout=120)
    writes = [
        e
        for e in cluster.audit_events()
        if e.get("objectRef", {}).get("resource") == "nodemodelstores"
        and e["objectRef"].get("subresource") == "status"
        and e["objectRef"].get("name") == plugin.node
        and e["verb"] in ("patch", "update")
        and e["stage"] == "ResponseComplete"
        and "gpustack-models-plugin" in e["user"]["username"]
    ]
    # The writes of a state (the store's first status, Downloading, Ready) and at least one progress write
    # while downloading; at most 20 of those (one per 5 % step).
    assert 4 <= len(writes) <= 3 + 20, len(writes)
    # progress reads and writes nothing.
    mark = len(cluster.audit_events())
    for _ in range(5):
        scenario.progress()
    # The audit log is written in order: once a later request is in it, so is anything progress did.
    marker = f"audit-marker-{uuid.uuid4().hex[:8]}"
    scenario.admin.get(f"{scenario.cluster.server}{STORAGE}/nodemodelstores", headers={"User-Agent": marker})
    wait_for(
        lambda: any(e.get("userAgent") == marker for e in cluster.audit_events()[mark:]),
        timeout=10,
        message="the marker request in the audit log",
    )
    later = cluster.audit_events()[mark:]
    progress_writes = [
        e
        for e in later
        if e["verb"] in ("create", "update", "patch", "delete")
        and e.get("objectRef", {}).get("apiGroup") == GROUP
        and "gpustack-models-worker" in e["user"]["username"]
    ]
    assert progress_writes == []


def test_it_reads_at_most_64_plugins_live_and_skips_a_silent_one(scenario, launcher, worker_kube):
    from .fakeplugins import FakePlugins

    scenario.artifact()
    size = sum(len(d) for d in scenario.files.values())
    prefix = uuid.uuid4().hex[:5]
    nodes = [(f"fake-{prefix}-{i:02d}", f"127.0.2.{i + 1}") for i in range(71)]  # sorted by index
    for node, address in nodes:
        launcher.register_node(node, address)
    try:
        for node, _ in nodes:
            wait_for(lambda node=node: _store(worker_kube, node), timeout=60, message="the fake nodes' stores")
        with FakePlugins(launcher, [a for _, a in nodes], PLUGIN_PORT) as fakes:

            def stored(i):  # node i has stored (i + 1) % of the content; its plugin has 0.5 % more
                return size * (i + 1) // 100

            extra = size // 200
            for i, (node, address) in enumerate(nodes[:70]):
                _put_entry(
                    worker_kube,
                    node,
                    {
                        "digest": scenario.digest,
                        "state": "Downloading",
                        "sizeBytes": size,
                        "downloadedBytes": stored(i),
                    },
                )
                fakes.plugins[address].downloads = [
                    {
                        "digest": scenario.digest,
                        "downloadedBytes": stored(i) + extra,
                        "sizeBytes": size,
                        "source": "Hub",
                    }
                ]
            wait_for(lambda: scenario.progress()["downloading"] == 70, timeout=60, message="70 downloading nodes")
            answer = scenario.progress()
            assert answer["live"] == 64  # at most 64 read live (the first by name); 6 from stored bytes
            assert answer["downloadingBytes"] == sum(stored(i) + (extra if i < 64 else 0) for i in range(70))
            # One of the 64 never answers: the answer still comes in time, that node from its stored bytes.
            fakes.plugins[nodes[0][1]].hang = True  # how long that takes: `make bench`
            answer = scenario.progress()
            assert answer["live"] == 63
            assert answer["downloadingBytes"] == sum(stored(i) + (extra if 0 < i < 64 else 0) for i in range(70))
            percent = answer["downloadingPercent"]
            assert 30 <= percent <= 40  # the mean of 1..70 % (plus the live half percent)
            _put_entry(
                worker_kube,
                nodes[70][0],
                {"digest": scenario.digest, "state": "Ready", "sizeBytes": size, "downloadedBytes": size},
            )
            wait_for(lambda: scenario.progress()["ready"] == 1, timeout=30, message="the ready node")
            assert scenario.progress()["downloadingPercent"] == percent
    finally:
        for node, _ in nodes:
            launcher.unregister_node(node)


def _store(client, node):
    try:
        return client.get(f"{STORAGE}/nodemodelstores/{node}")
    except kube.NotFound:
        return None


def _put_entry(kube, node, entry):
    kube_update(kube, f"{STORAGE}/nodemodelstores/{node}/status", lambda obj: dict(obj, status={"models": [entry]}))


def test_it_holds_the_nodes_bytes_per_second(scenario, hub, core, launcher):
    scenario.artifact(files=big_files(scenario.repo, mb=16))
    (plugin,) = scenario.plugins(1)
    rate = 1_500_000
    core.patch_node(plugin.node, {"metadata": {"annotations": {f"{GROUP}/download-bytes-per-second": str(rate)}}})

    def followed():  # the spec carries the limit, and the plugin reports the generation that carries it
        store = scenario.kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}")
        observed = (store.get("status") or {}).get("observedGeneration")
        return store["spec"]["download"]["bytesPerSecond"] == rate and observed == store["metadata"]["generation"]

    wait_for(followed, timeout=30, message="the plugin to follow the node's limit")
    scenario.prefetch([plugin])
    # Measured where the bytes land (the plugin's live count), in the middle of the download: the hub's
    # side would count what the kernel buffered too.
    wait_for(lambda: live_bytes(plugin, launcher, scenario.digest) > 2_000_000, timeout=60, message="2 MB in")
    t1, b1 = time.monotonic(), live_bytes(plugin, launcher, scenario.digest)
    time.sleep(5)
    t2, b2 = time.monotonic(), live_bytes(plugin, launcher, scenario.digest)
    measured = (b2 - b1) / (t2 - t1)
    assert abs(measured - rate) / rate <= 0.10, f"{measured:.0f} B/s against a limit of {rate}"
    scenario.wait_state(plugin.node, "Ready", timeout=60)


def test_it_answers_health_under_idle_half_tls_and_byte_at_a_time_connections(scenario):
    from tests.plugin.attackers import Attack, client_context, probe

    (plugin,) = scenario.plugins(1)
    with Attack(plugin.address, PLUGIN_PORT, idle=50, hellos=5) as attack:
        answers = probe(plugin.address, PLUGIN_PORT, ["/livez", "/readyz"], client_context(), rounds=10)
        held = attack.held()
        slow = [attack.slow_hello, attack.slow_request]
    assert [a for a in answers if a[1] != 200 or a[2] >= 1.0] == [], (answers, attack.not_connected)
    assert len(answers) == 20
    # The attack was in force all along: every connection held open, the slow clients still sending.
    assert attack.not_connected == 0 and held == 55
    assert [(c.cut_after, c.error) for c in slow] == [(None, None)] * 2 and min(c.sent for c in slow) >= 10
