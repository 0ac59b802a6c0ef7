"""Real node plugins (``python -m gpustack_models.plugin``) with the worker, the control plane and the fake hub:
download, verify, publish, report, and the live ``progress`` subresource."""

import base64
import datetime as dt
import hashlib
import itertools
import json
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpustack_models import kube
from gpustack_models.kinds import GROUP
from gpustack_models.plugin.engine.cache import read_json
from tests.support import PLUGIN_PORT, TEST_STATE, kube_update, read_modify_write, token_http, wait_for
from tests.support.cluster import fresh_namespace
from tests.support.plugins import client_cert, service_client_cert
from tests.support.stores import place

STORAGE = f"/apis/{GROUP}/v1alpha1"
OLD_PLUGIN_AUDIENCE = "gpustack-models-plugin"  # the audience of the tokens the service once showed plugins
_addresses = (f"127.0.1.{i}" for i in itertools.count(10))
MiB = 1024 * 1024


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

    def artifact(self, name="art", files=None, ns=None, repo=None, secret=None):
        """Create an artifact of ``repo`` (default: the scenario's, added to the hub at the first call),
        optionally with a ``secretRef``; return its digest once resolved."""
        if not self.files:
            self.files = files or big_files(self.repo)
            self.hub.add_hf_repo(self.repo, self.files)
        ns = ns or self.ns
        source = {"repository": repo or self.repo}
        if secret:
            source["secretRef"] = {"name": secret}
        self.kube.create(
            f"{STORAGE}/namespaces/{ns}/modelartifacts",
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "ModelArtifact",
                "metadata": {"name": name},
                "spec": {"source": {"huggingFace": source}},
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
        where = [(f"node-{uuid.uuid4().hex[:5]}", next(_addresses)) for _ in range(count)]
        return self.start_plugin.many(where, **env)

    def prefetch(self, nodes, name="warm", artifact="art", ns=None):
        self.kube.create(
            f"{STORAGE}/namespaces/{ns or self.ns}/modelprefetches",
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "ModelPrefetch",
                "metadata": {"name": name},
                "spec": {"artifactRef": {"name": artifact}, "nodeNames": [p.node for p in nodes]},
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
        seen = {}

        def check():
            e = seen["entry"] = self.entry(node)
            return e if e and e["state"] == state and (reason is None or e.get("reason") == reason) else None

        try:
            return wait_for(check, timeout=timeout, interval=0.3, message=f"{node} to be {state} {reason or ''}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its entry at the end: {seen.get('entry')}") from None

    def progress(self, name="art", ns=None):
        url = f"{self.cluster.server}/apis/{GROUP}/v1/namespaces/{ns or self.ns}/modelartifacts/{name}/progress"
        resp = self.admin.get(url)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def tree(self, plugin) -> Path:
        return plugin.cache / "models" / self.digest.split(":", 1)[1]


def artifact_path(namespace, name):
    return f"{STORAGE}/namespaces/{namespace}/modelartifacts/{name}"


def condition_of(kube, namespace, name, type_):
    for cond in (kube.get(artifact_path(namespace, name)).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return cond
    return None


def test_it_downloads_to_three_nodes_with_live_progress(scenario, hub, kubectl, core, worker_kube):
    from kubernetes import client as k8s

    scenario.artifact(files=big_files(scenario.repo, mb=8))
    # Each node from the hub alone (no bytes from each other), so the hub holds every download at 2 MiB,
    # then at 5 MiB, until the test lets it go on: the three downloads are watched mid-way.
    plugins = scenario.plugins(3, GPUSTACK_PLUGIN_FANOUT="false")
    early = hub.faults.pause(scenario.weights, after_bytes=2 * MiB)
    later = hub.faults.pause(scenario.weights, after_bytes=5 * MiB)
    scenario.prefetch(plugins)
    early.wait_held(3, timeout=60)
    for p in plugins:
        scenario.wait_state(p.node, "Downloading", timeout=60)

    def live(at):  # three downloads read live, each ``at`` bytes into the weights
        pr = scenario.progress()
        return pr["downloading"] == 3 and pr["live"] == 3 and pr["downloadingBytes"] >= 3 * at and pr

    first = wait_for(lambda: live(2 * MiB), timeout=30, message="three live downloads at 2 MiB")
    assert "downloadingPercent" in first
    early.release()
    later.wait_held(3, timeout=30)
    second = wait_for(lambda: live(5 * MiB), timeout=30, message="live bytes to move between two answers")
    assert first["downloadingBytes"] < 3 * 5 * MiB <= second["downloadingBytes"]
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
        # The rest at a hub-wide 1.5 MiB/s: progress tells the rate and when the last node is done, as
        # kubectl prints it.
        hub.total_rate = 3 * MiB // 2
        later.release()
        # The rate is over about the last 10 s, the hold included at first: the ETA comes down as bytes flow.
        moving = wait_for(lambda: (pr := scenario.progress())["live"] == 3 and 0 < pr.get("etaSeconds", 0) < 60 and pr,
                          timeout=30, message="a rate and an ETA under a minute")  # fmt: skip
        assert moving["bytesPerSecond"] > 0, moving
        table = kubectl("get", "mart", "art", "-n", scenario.ns, "--subresource=progress").stdout.splitlines()
        header, row = table[0].split(), table[1].split()
        assert header[5:8] == ["BYTES", "RATE", "ETA"] and row[6].endswith("/s"), table
        hub.total_rate = 0
        for p in plugins:
            scenario.wait_state(p.node, "Ready", timeout=120)
        # progress reads the mirror, a moment behind the stores' status the waits above read
        done = wait_for(lambda: (pr := scenario.progress())["ready"] == 3 and pr, timeout=30, message="3 ready")
        assert (done["ready"], done["downloading"], done["live"]) == (3, 0, 0)
        assert "downloadingPercent" not in done and "etaSeconds" not in done
        assert scenario.progress("twin", ns=other)["ready"] == 3
        # Ready is the namespace's own: the prefetch's namespace waits for it with kubectl; the twin counts
        # the three copies (READY) but nothing of its namespace asks for it, and its condition says so.
        kubectl("wait", "--for=condition=Ready", "mart/art", "-n", scenario.ns, "--timeout=30s")
        ready = {c["type"]: c for c in scenario.kube.get(artifact_path(scenario.ns, "art"))["status"]["conditions"]}
        assert ready["Ready"]["message"].startswith("ready on 3 of 3 nodes this namespace asks for it on"), ready
        twin_ready = wait_for(lambda: condition_of(scenario.kube, other, "twin", "Ready"), timeout=30, message="twin")
        assert (twin_ready["status"], twin_ready["reason"]) == ("False", "NotRequested"), twin_ready
        assert "create a ModelPrefetch" in twin_ready["message"]
    finally:
        hub.total_rate = 0
        core.delete_namespace(other)
    for p in plugins:
        for path, data in scenario.files.items():
            assert (scenario.tree(p) / path).read_bytes() == data
    listing = kubectl("get", "nms", *[p.node for p in plugins], "-o", "wide").stdout
    rows = {line.split()[0]: line.split() for line in listing.splitlines()[1:]}
    assert listing.split()[:5] == ["NAME", "READY", "CACHE", "VOLUME", "MODELS"], listing
    for p in plugins:  # READY, CACHE, VOLUME ("<percent>% of <size>", the capacity figure's), MODELS
        cells = rows[p.node]
        assert cells[1:3] == ["1", "8.0Mi"] and cells[3].endswith("%") and cells[4] == "of" and cells[6] == "1", cells


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
    """The plugin's live count of ``digest``'s bytes, read as the worker reads it (its client certificate)."""
    s = requests.Session()
    s.trust_env = False
    resp = s.get(f"{plugin.url}/model/downloads", verify=False, cert=service_client_cert(launcher))
    return next((d["downloadedBytes"] for d in resp.json()["downloads"] if d["digest"] == digest), 0)


def test_it_resumes_after_a_dropped_connection_and_a_kill(scenario, hub, launcher):
    scenario.artifact(files=big_files(scenario.repo, mb=12))
    size = len(scenario.files["model.safetensors"])
    (plugin,) = scenario.plugins(1)
    hub.faults.drop(scenario.weights, after_bytes=1_500_000)
    # The resumed request held 4.5 MB into its body (about 6 MB into the file) until the plugin is killed:
    # the file is far from finished when a checkpoint passes 4 MB, however long the checkpoint's fsync takes.
    held = hub.faults.pause(scenario.weights, after_bytes=4_500_000)
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Downloading")
    held.wait_held(timeout=60)
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
    audited = len(scenario.cluster.audit_events())
    plugin.start()

    def rewritten():  # the restarted plugin writes its status from disk: a newer write than the failure's
        store = scenario.kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}")
        entry = scenario.entry(plugin.node)
        return int(store["metadata"]["resourceVersion"]) > written and entry and entry["state"] == "Failed" and entry

    again = wait_for(rewritten, timeout=30, message="the restarted plugin's status write")
    assert again["retryTime"] == failed["retryTime"] and again["reason"] == "SourceUnavailable"
    # The restarted plugin was up before retryTime (its first status write, as kube-apiserver received it):
    # else the check below, that it asked the hub nothing before then, could not fail.
    up = min(_received(e) for e in status_writes(scenario.cluster, plugin.node, since=audited))
    assert up < retry_at, f"the restart took longer than the backoff ({up - retry_at:.1f} s): nothing was checked"
    hub.faults.clear()
    scenario.wait_state(plugin.node, "Ready", timeout=90)
    downloads = [
        r for r in hub.requests[mark:] if r.listener == "cdn" or f"/{scenario.repo}/resolve/" in r.path
    ]  # fmt: skip
    assert downloads, "the retry fetched nothing"
    early = [r.target for r in downloads if r.started < retry_at]
    assert early == [], f"asked the hub before retryTime {failed['retryTime']}: {early}"
    assert scenario.entry(plugin.node).get("retryTime") is None


def status_writes(cluster, node, since=0):
    """The audit events of the node plugin's writes of ``node``'s store status, from the ``since``-th event."""
    return [
        e
        for e in cluster.audit_events()[since:]
        if e.get("objectRef", {}).get("resource") == "nodemodelstores"
        and e["objectRef"].get("subresource") == "status"
        and e["objectRef"].get("name") == node
        and e["verb"] in ("patch", "update")
        and e["stage"] == "ResponseComplete"
        and "gpustack-models-plugin" in e["user"]["username"]
    ]


def _received(event) -> float:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()


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
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS=6)
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Ready", timeout=90)
    before = len(hub.requests)
    scenario.kube.delete(f"{STORAGE}/nodemodelstores/{plugin.node}")
    scenario.wait_state(plugin.node, "Ready", timeout=10)
    assert len(hub.requests) == before, "a recreated store caused hub requests"
    # Out of spec.models at the collectTime its grace announced; the node's removal delay (6 s here) runs from
    # that time, which its status shows from the start of the grace.
    scenario.kube.delete(f"{STORAGE}/namespaces/{scenario.ns}/modelprefetches/warm")

    def spec_item():
        spec = scenario.kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}")["spec"]
        return next((m for m in spec.get("models") or [] if m["digest"] == scenario.digest), None)

    announced = wait_for(lambda: (spec_item() or {}).get("collectTime"), timeout=30, message="the grace announced")
    due = datetime.fromisoformat(announced.replace("Z", "+00:00")).timestamp() + 6
    shown = wait_for(lambda: (scenario.entry(plugin.node) or {}).get("collectTime"), message="its removal time")
    assert datetime.fromisoformat(shown.replace("Z", "+00:00")).timestamp() == due
    wait_for(lambda: spec_item() is None, timeout=30, interval=0.1, message="the digest to leave spec.models")
    wait_for(lambda: not scenario.tree(plugin).exists(), timeout=30, interval=0.1, message="removal after the delay")
    gone = time.time()
    assert gone >= due, f"removed {due - gone:.2f} s before the collectTime and the delay"
    wait_for(lambda: scenario.entry(plugin.node) is None, timeout=15, message="the entry to leave the status")


def test_it_evicts_unreferenced_trees_least_recently_used_first_to_make_room(scenario, hub):
    # 13 MB volume, watermarks 80/70: three 3 MiB trees fit (73 %), a 6 MiB one needs two of them gone.
    (plugin,) = scenario.plugins(
        1, GPUSTACK_PLUGIN_CAPACITY_BYTES=13_000_000, GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS=3600
    )
    digests = {"a": scenario.artifact(name="a")}
    for name, mb in (("b", 3), ("c", 3), ("d", 6)):
        repo = f"{scenario.repo}-{name}"
        hub.add_hf_repo(repo, big_files(repo, mb=mb))
        digests[name] = scenario.artifact(name=name, repo=repo)

    def entry(digest):
        store = scenario.kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}")
        return next((m for m in (store.get("status") or {}).get("models") or [] if m["digest"] == digest), None)

    def tree(digest):
        return plugin.cache / "models" / digest.split(":", 1)[1]

    def prefetch_ready(name):
        scenario.prefetch([plugin], name=f"warm-{name}", artifact=name)
        wait_for(lambda: (entry(digests[name]) or {}).get("state") == "Ready", timeout=90, message=f"{name} Ready")

    for name in "abc":  # one after the other: a is the least recently used, then b
        prefetch_ready(name)
    for name in "ab":  # nothing references a and b any more; the long removal delay keeps their trees
        scenario.kube.delete(f"{STORAGE}/namespaces/{scenario.ns}/modelprefetches/warm-{name}")
    wait_for(
        lambda: all("collectTime" in (entry(digests[n]) or {}) for n in "ab"),
        timeout=30,
        message="a and b to be unreferenced (a collectTime in their entries)",
    )
    assert tree(digests["a"]).exists() and tree(digests["b"]).exists()

    prefetch_ready("d")
    assert not tree(digests["a"]).exists() and not tree(digests["b"]).exists()
    assert entry(digests["a"]) is None and entry(digests["b"]) is None
    assert tree(digests["c"]).exists() and entry(digests["c"])["state"] == "Ready"  # referenced: kept
    log = (TEST_STATE / f"plugin-{plugin.node}.log").read_text()
    evicted = [line.split("evicted ", 1)[1].split()[0] for line in log.splitlines() if " evicted sha256:" in line]
    assert evicted == [digests["a"], digests["b"]], "not evicted least recently used first"


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
    # Live bytes are for the worker's client certificate alone. No token opens them, whoever's and for whatever
    # audience (the worker's for the plugins' old audience, which a node could replay to every other, included),
    # nor a plugin's own client certificate.
    s = requests.Session()
    s.trust_env = False
    url = f"{a.url}/model/downloads"

    def downloads(token=None, cert=None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        resp = s.get(url, verify=False, headers=headers, cert=cert)
        assert resp.status_code == 200 or scenario.digest not in resp.text, resp.text  # nothing served
        return resp.status_code

    worker_for_audience = launcher.service_account_token("gpustack-models-worker", 600, audiences=[OLD_PLUGIN_AUDIENCE])
    assert downloads(worker_for_audience) == 401  # what every plugin once received: replayed, it opens nothing
    assert downloads() == 401
    assert downloads(tenant) == 401
    assert downloads(token_a) == 401
    assert downloads(service_kubeconfig_token(launcher)) == 401
    plugin_for_audience = launcher.service_account_token("gpustack-models-plugin", 600, audiences=[OLD_PLUGIN_AUDIENCE])
    assert downloads(plugin_for_audience) == 401
    assert downloads(launcher.plugin_token(b.node, audiences=["gpustack-models-peer"])) == 401
    assert downloads(cert=client_cert(b)) == 403  # another node's plugin: the CA's, not the worker
    assert downloads(cert=client_cert(a)) == 403  # nor its own
    assert downloads(worker_for_audience, cert=client_cert(b)) == 403  # a token beside it changes nothing
    assert downloads(cert=service_client_cert(launcher)) == 200
    # Nothing on the node side names a tenant.
    text = json.dumps(scenario.kube.get(f"{STORAGE}/nodemodelstores/{a.node}"))
    metrics = s.get(f"{a.url}/metrics", verify=False).text
    for secret in (scenario.ns, scenario.repo, "art", "warm"):
        assert secret not in text.replace(scenario.digest, "") and secret not in metrics


def service_kubeconfig_token(launcher) -> str:
    """The worker's own credential for kube-apiserver (what it must never show a plugin)."""
    import yaml

    return yaml.safe_load(launcher.service_kubeconfig.read_text())["users"][0]["user"]["token"]


def launcher_token(plugin):
    import yaml

    return yaml.safe_load(Path(plugin.env["KUBECONFIG"]).read_text())["users"][0]["user"]["token"]


def test_it_writes_progress_on_thresholds_and_progress_writes_nothing(scenario, hub, cluster):
    scenario.artifact(files=big_files(scenario.repo, mb=4))
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_PROGRESS_INTERVAL=3)
    first = hub.faults.pause(scenario.weights, after_bytes=1 * MiB)
    then = hub.faults.pause(scenario.weights, after_bytes=2 * MiB)
    scenario.prefetch([plugin])

    def downloading(at):
        e = scenario.entry(plugin.node)
        return e and e["state"] == "Downloading" and e.get("downloadedBytes", 0) >= at and e

    first.wait_held(timeout=60)
    wait_for(lambda: downloading(1 * MiB), timeout=30, message="the status at 1 MiB")
    first.release()  # 25 % more, then held again: only a progress write can show it, after the interval
    then.wait_held(timeout=30)
    wait_for(lambda: downloading(2 * MiB), timeout=30, message="a progress write at 2 MiB")
    then.release()
    scenario.wait_state(plugin.node, "Ready", timeout=120)
    writes = status_writes(cluster, plugin.node)
    # The writes of a state (the store's first status, Downloading, Ready) and at least one progress write
    # while downloading; at most 20 of those (one per 5 % step).
    assert 4 <= len(writes) <= 3 + 20, len(writes)

    # progress reads and writes nothing: once the worker has written what the Ready entry changes (the
    # artifact's node counts and the prefetch's), the audit log holds no write of the worker's while it answers.
    def settled():
        art = scenario.kube.get(f"{STORAGE}/namespaces/{scenario.ns}/modelartifacts/art").get("status") or {}
        warm = scenario.kube.get(f"{STORAGE}/namespaces/{scenario.ns}/modelprefetches/warm").get("status") or {}
        counts = [(art.get("nodes") or {}).get(k) for k in ("ready", "downloading", "failed")]
        return counts == [1, 0, 0] and [warm.get("readyNodes"), warm.get("downloadingNodes")] == [1, 0]

    wait_for(settled, timeout=30, message="the artifact's and the prefetch's counts of the Ready node")
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
    assert progress_writes == [], [(e["verb"], e["objectRef"], e["user"]["username"]) for e in progress_writes]


def test_it_reads_at_most_64_plugins_live_and_skips_a_silent_one(scenario, launcher, worker_kube):
    from tests.fakeplugins import FakePlugins

    scenario.artifact()
    size = sum(len(d) for d in scenario.files.values())
    prefix = uuid.uuid4().hex[:5]
    nodes = [(f"fake-{prefix}-{i:02d}", f"127.0.2.{i + 1}") for i in range(71)]  # sorted by index
    for node, address in nodes:
        launcher.register_node(node, address)
    try:
        for node, _ in nodes:
            wait_for(lambda node=node: _store(worker_kube, node), timeout=60, message="the fake nodes' stores")
        place(worker_kube, scenario.ns, "art", scenario.digest, [n for n, _ in nodes])  # their entries count
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
        try:
            store = scenario.kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}")
        except kube.NotFound:  # the worker creates the new node's store a moment after the plugin starts
            return False
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


def test_it_shows_plugins_no_token_but_its_own_short_lived_client_certificate(scenario, launcher, worker_kube):
    from tests.fakeplugins import FakePlugins

    scenario.artifact()
    node, address = f"fake-{uuid.uuid4().hex[:5]}", "127.0.2.200"
    launcher.register_node(node, address)
    try:
        wait_for(lambda: _store(worker_kube, node), timeout=60, message="the fake node's store")
        place(worker_kube, scenario.ns, "art", scenario.digest, [node])  # its entry counts
        with FakePlugins(launcher, [address], PLUGIN_PORT) as fakes:
            entry = {"digest": scenario.digest, "state": "Downloading", "sizeBytes": 1000, "downloadedBytes": 10}
            _put_entry(worker_kube, node, entry)
            fakes.plugins[address].downloads = [dict(entry, downloadedBytes=20, source="Hub")]
            wait_for(lambda: scenario.progress()["live"] == 1, timeout=60, message="a live read of the fake plugin")
            shown, presented = fakes.plugins[address].tokens, fakes.plugins[address].clients
            ca = x509.load_pem_x509_certificate(fakes.ca_file.read_bytes())
    finally:
        launcher.unregister_node(node)
    assert shown == []  # no token of any kind reaches a node
    assert presented, "progress presented no client certificate"
    cert = x509.load_der_x509_certificate(presented[-1])
    cert.verify_directly_issued_by(ca)  # the plugin CA's, made by the worker with the key it holds
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:gpustack-models-service"
    usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == [ExtendedKeyUsageOID.CLIENT_AUTH]  # it cannot serve as a plugin
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= dt.timedelta(hours=1, minutes=1)


# --- One tenant cannot break the download of a digest others share ----------------------------------------


@pytest.fixture
def tenant(core):
    """Another tenant's namespace (the attacker's), deleted after the test."""
    yield from fresh_namespace(core)


def put_secret(core, ns, name, token):
    """Create or replace the Secret ``name`` whose key ``token`` is the hub token."""
    from kubernetes import client as k8s

    body = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), data={"token": base64.b64encode(token.encode()).decode()})
    try:
        core.create_namespaced_secret(ns, body)
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
        core.replace_namespaced_secret(name, ns, body)


def failed_downloads(plugin) -> float:
    """The plugin's count of downloads that ended Failed (any reason), from its metrics."""
    s = requests.Session()
    s.trust_env = False
    text = s.get(f"{plugin.url}/metrics", verify=False).text
    line = next(
        x for x in text.splitlines() if x.startswith('gpustack_models_plugin_downloads_finished_total{state="Failed"}')
    )
    return float(line.split()[-1])


def ready_without_failing(scenario, plugin, timeout=120):
    """Wait for the node's entry to be Ready; fail as soon as it is seen Failed (a backoff), and check
    that the plugin ended no download Failed, seen or not."""

    def check():
        e = scenario.entry(plugin.node)
        if e and e["state"] == "Failed":
            raise AssertionError(
                f"the entry went Failed: {e.get('reason')}: {e.get('message')} until {e.get('retryTime')}"
            )
        return e if e and e["state"] == "Ready" else None

    wait_for(check, timeout=timeout, interval=0.2, message=f"{plugin.node} to be Ready")
    assert failed_downloads(plugin) == 0
    for path, data in scenario.files.items():
        assert (scenario.tree(plugin) / path).read_bytes() == data


def assert_no_token_shown(scenario, plugin, *tokens):
    status = json.dumps(scenario.kube.get(f"{STORAGE}/nodemodelstores/{plugin.node}"))
    log = (TEST_STATE / f"plugin-{plugin.node}.log").read_text(errors="replace")
    for token in tokens:
        assert token not in status and token not in log


@pytest.mark.parametrize("gone", ["private", "deleted"])
def test_a_tenants_copy_gone_does_not_fail_another_tenants_download(scenario, hub, tenant, gone):
    scenario.artifact()  # the victim's artifact: a public repository
    copy = f"org/copy-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(copy, scenario.files)  # the attacker's own copy: the same files, the same digest
    assert scenario.artifact("copy", ns=tenant, repo=copy) == scenario.digest  # resolved later, no Secret: first
    if gone == "private":  # then the copy becomes inaccessible
        hub.set_private(copy)
    else:
        hub.delete_repo(copy)
    (plugin,) = scenario.plugins(1)
    scenario.prefetch([plugin], ns=tenant, artifact="copy")  # and the attacker references it on the node too
    scenario.prefetch([plugin])

    ready_without_failing(scenario, plugin)
    refused = [r for r in hub.requests if f"/{copy}/resolve/" in r.path and r.status in (401, 403, 404)]
    assert refused, "the copy was never tried: nothing fell through"
    assert len(refused) <= len(scenario.files)  # each file at most once: then the copy is skipped


def test_a_tenants_bad_token_does_not_fail_another_tenants_download(scenario, hub, core, tenant):
    good, planted, bad = (f"hf_{kind}_{uuid.uuid4().hex}" for kind in ("victim", "planted", "bad"))
    hub.add_token(good)
    hub.add_token(planted)
    put_secret(core, scenario.ns, "victim-token", good)
    scenario.artifact(secret="victim-token")  # the victim's artifact: public files, its own token
    put_secret(core, tenant, "aaa", planted)  # a Secret named to sort first, with a token that resolves...
    assert scenario.artifact("borrow", ns=tenant, secret="aaa") == scenario.digest
    put_secret(core, tenant, "aaa", bad)  # ...then a bad token in it
    (plugin,) = scenario.plugins(1)
    scenario.prefetch([plugin], ns=tenant, artifact="borrow")
    scenario.prefetch([plugin])

    ready_without_failing(scenario, plugin)
    downloads = [r for r in hub.requests if f"/{scenario.repo}/resolve/" in r.path and r.method == "GET"]
    assert any(r.token == bad and r.status == 401 for r in downloads), "the bad token was never tried"
    assert {r.token for r in downloads if r.status in (200, 206, 302)} == {good}
    assert_no_token_shown(scenario, plugin, good, planted, bad)


def test_a_private_source_with_a_good_token_still_downloads(scenario, hub, core):
    token = f"hf_private_{uuid.uuid4().hex}"
    private = f"org/private-{uuid.uuid4().hex[:6]}"
    scenario.files = big_files(private)
    hub.add_hf_repo(private, scenario.files, private=True, token=token)
    put_secret(core, scenario.ns, "hub-token", token)
    scenario.artifact(repo=private, secret="hub-token")
    (plugin,) = scenario.plugins(1)
    scenario.prefetch([plugin])

    ready_without_failing(scenario, plugin)
    downloads = [r for r in hub.requests if f"/{private}/resolve/" in r.path and r.method == "GET"]
    assert downloads and {(r.token, r.status) for r in downloads} <= {(token, 200), (token, 206), (token, 302)}
    assert_no_token_shown(scenario, plugin, token)


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
