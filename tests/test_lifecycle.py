"""The cache's lifecycle with the real worker (Celery worker and beat processes), real plugins and the control
plane: prefetch by node selector, the collection grace, retention, disk pressure, the per-node cap and the
status a tenant can act on. The suite's worker runs with an 8 s collection grace checked every 2 s and a
cap of 16 digests per node."""

import time
import uuid
from datetime import timedelta

import pytest

from gpustack_models.kinds import GROUP
from gpustack_models.kinds.formatting import parse_time
from tests.support import wait_for
from tests.support.stores import (
    assert_grace,
    cap_digests,
    cap_prefetches,
    fill_past_the_cap,
    first_seen,
    node_full,
    store,
    tenants_of,
)
from tests.support.worker import COLLECTION_GRACE, MODELS_PER_NODE
from tests.test_plugins import big_files

STORAGE = f"/apis/{GROUP}/v1alpha1"
PINNING_ALLOWED = f"{GROUP}/pinning-allowed"


def allow_pinning(core, namespace):
    """An administrator lets ``namespace``'s prefetches pin (elsewhere a pinned prefetch is kept unpinned);
    returns once the worker's mirror knows (with ``mirror_db``)."""
    from gpustack_models.reconcilers.budgets import pinning_allowed

    core.patch_namespace(namespace, {"metadata": {"annotations": {PINNING_ALLOWED: "true"}}})
    wait_for(lambda: pinning_allowed(namespace), timeout=30, message=f"{namespace} allowed to pin in the mirror")


@pytest.fixture
def life(scenario):
    return scenario


def spec_item(kube, node, digest):
    for item in ((store(kube, node) or {}).get("spec") or {}).get("models") or []:
        if item["digest"] == digest:
            return item
    return None


def collect_item(kube, node, digest):
    """The spec item of ``digest`` on ``node`` once it has a collectTime."""
    item = spec_item(kube, node, digest)
    return item if item and "collectTime" in item else None


def prefetch_status(kube, ns, name):
    return kube.get(f"{STORAGE}/namespaces/{ns}/modelprefetches/{name}").get("status") or {}


def conditions(kube, ns, name):
    return {c["type"]: c for c in prefetch_status(kube, ns, name).get("conditions") or []}


def wait_condition(kube, ns, name, type_, status, reason=None, timeout=60):
    def check():
        cond = conditions(kube, ns, name).get(type_)
        if cond and cond["status"] == status and (reason is None or cond["reason"] == reason):
            return cond
        return None

    return wait_for(check, timeout=timeout, message=f"{ns}/{name} {type_}={status} {reason or ''}")


def create_prefetch(kube, ns, name, artifact, **spec):
    return kube.create(
        f"{STORAGE}/namespaces/{ns}/modelprefetches",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelPrefetch",
            "metadata": {"name": name},
            "spec": {"artifactRef": {"name": artifact}, **spec},
        },
    )


def label(core, node, value):
    core.patch_node(node, {"metadata": {"labels": {"tier": value}}})


def hub_downloads(hub, since):
    return [r for r in hub.requests[since:] if r.listener == "cdn" or "/resolve/" in r.path]


def test_a_node_selector_follows_the_labels_and_the_unselected_node_loses_its_bytes(
    life, core, worker_kube, kubectl, mirror_db
):
    from gpustack_models.models import Node

    life.artifact()
    a, b, c = life.plugins(3, GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS=1)
    label(core, a.node, "gpu")
    label(core, b.node, "gpu")
    # The worker knows both labels before the prefetch selects (its Nodes and prefetches are watched apart).
    wait_for(lambda: Node.objects.live().filter(name__in=[a.node, b.node], labels__tier="gpu").count() == 2,
             message="the labels in the worker's mirror")  # fmt: skip
    create_prefetch(worker_kube, life.ns, "warm", "art", nodeSelector={"matchLabels": {"tier": "gpu"}})
    wait_condition(worker_kube, life.ns, "warm", "Available", "True", timeout=120)
    status = prefetch_status(worker_kube, life.ns, "warm")
    assert (status["desiredNodes"], status["readyNodes"]) == (2, 2)
    assert life.entry(c.node) is None

    label(core, c.node, "gpu")  # a third node joins the selection
    life.wait_state(c.node, "Ready", timeout=120)
    wait_for(lambda: prefetch_status(worker_kube, life.ns, "warm").get("readyNodes") == 3, message="3 ready")
    table = kubectl("get", "mpf", "-o", "wide", "-n", life.ns).stdout
    print(table)
    header, row = table.splitlines()
    assert header.split() == ["NAME", "ARTIFACT", "DESIRED", "READY", "DOWNLOADING", "LAPSED", "AVAILABLE", "AGE"]
    assert row.split()[:7] == ["warm", "art", "3", "3", "0", "0", "True"]

    # And one leaves it: its bytes go after the grace (and the plugin's removal delay of 1 s), the others
    # keep theirs.
    left, left_wall = time.monotonic(), time.time()
    label(core, a.node, "cpu")
    wait_for(lambda: prefetch_status(worker_kube, life.ns, "warm").get("desiredNodes") == 2, message="2 desired")
    item = wait_for(lambda: collect_item(worker_kube, a.node, life.digest), message="a collectTime on the node left")
    assert_grace(item["collectTime"], left_wall, time.time())
    seen = first_seen({"left": lambda: spec_item(worker_kube, a.node, life.digest) is None,
                       "removed": lambda: not life.tree(a).exists()}, timeout=COLLECTION_GRACE + 60)  # fmt: skip
    assert seen["left"] - left >= COLLECTION_GRACE, "left spec.models before the collection grace"
    assert seen["removed"] - left >= COLLECTION_GRACE + 1, "the tree removed before the grace and the delay"
    wait_for(lambda: life.entry(a.node) is None, timeout=30, message="the entry to leave the status")
    assert life.tree(b).exists() and life.tree(c).exists()
    assert spec_item(worker_kube, b.node, life.digest) == {"digest": life.digest, "pinned": False}


def test_a_deleted_prefetch_leaves_after_the_grace_and_a_recreated_one_asks_the_hub_nothing(life, hub, worker_kube):
    life.artifact()
    (plugin,) = life.plugins(1, GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS=1)
    life.prefetch([plugin])
    life.wait_state(plugin.node, "Ready", timeout=120)
    mark = len(hub.requests)
    path = f"{STORAGE}/namespaces/{life.ns}/modelprefetches/warm"

    # Deleted and recreated within the grace: the bytes stay and the hub is not asked again.
    worker_kube.delete(path)
    wait_for(lambda: (spec_item(worker_kube, plugin.node, life.digest) or {}).get("collectTime"), message="grace")
    life.prefetch([plugin])
    wait_for(lambda: spec_item(worker_kube, plugin.node, life.digest) == {"digest": life.digest, "pinned": False},
             message="the reference back")  # fmt: skip
    wait_condition(worker_kube, life.ns, "warm", "Available", "True")
    assert hub_downloads(hub, mark) == [], "a prefetch recreated within the grace downloaded again"

    # Deleted for good: still in spec.models during the grace, then gone at its collectTime, and the tree a
    # second later (the plugin's removal delay of 1 s, from the collectTime); the removal time the node's
    # status shows is known from the start of the grace and never moves.
    deleted, deleted_wall = time.monotonic(), time.time()
    worker_kube.delete(path)
    item = wait_for(lambda: collect_item(worker_kube, plugin.node, life.digest), message="grace")
    assert_grace(item["collectTime"], deleted_wall, time.time())
    removal = parse_time(item["collectTime"]) + timedelta(seconds=1)
    entry = wait_for(lambda: (life.entry(plugin.node) or {}).get("collectTime"), message="collectTime in status")
    assert entry == removal.strftime("%Y-%m-%dT%H:%M:%SZ")
    shown = set()

    def removed():
        shown.add((life.entry(plugin.node) or {}).get("collectTime"))
        return not life.tree(plugin).exists()

    seen = first_seen({"left": lambda: spec_item(worker_kube, plugin.node, life.digest) is None,
                       "removed": removed}, timeout=COLLECTION_GRACE + 60)  # fmt: skip
    gone = time.time()
    assert seen["left"] - deleted >= COLLECTION_GRACE, "left spec.models before the grace"
    assert seen["removed"] - deleted >= COLLECTION_GRACE + 1, "the tree removed before the grace and the delay"
    assert gone >= removal.timestamp(), "removed before the time its status showed"
    assert shown - {None} == {entry}, f"the removal time shown moved: {sorted(shown - {None})}"
    wait_for(lambda: life.entry(plugin.node) is None, timeout=30, message="the entry gone")
    assert hub_downloads(hub, mark) == []


def target_state(ns, name, node):
    """(state, lapsed_at) of prefetch ``ns/name`` on ``node``, as the worker's last reconcile of it decided."""
    from gpustack_models.models import PrefetchTarget

    rows = PrefetchTarget.objects.filter(prefetch__namespace=ns, prefetch__name=name, prefetch__deleted=False)
    return rows.filter(node=node).values_list("state", "lapsed_at").first()


def test_retention_lapses_a_prefetch_and_its_content_is_collected_but_never_a_pinned_one(
    life, hub, worker_kube, mirror_db, core, kubectl
):
    allow_pinning(core, life.ns)
    life.artifact()
    (plugin,) = life.plugins(1, GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS=1)
    create_prefetch(worker_kube, life.ns, "brief", "art", nodeNames=[plugin.node],
                    retention={"ttlAfterLastUse": "3s"})  # fmt: skip
    life.wait_state(plugin.node, "Ready", timeout=120)
    brief = life.tree(plugin)
    lapsed = wait_condition(worker_kube, life.ns, "brief", "Lapsed", "True", timeout=60)
    assert "1 of 1 nodes" in lapsed["message"] and "change the prefetch's spec" in lapsed["message"]
    # Said as what it is while the files still wait out their grace: lapsed, not ready, not a stall.
    lapsed_view(worker_kube, kubectl, life.ns, "brief")
    assert brief.exists()
    # While that content waits out its grace: of two prefetches of other content with the same retention,
    # the unpinned one lapses and the pinned one never does, in the same reconciles.
    repo = f"org/kept-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {"config.json": repo.encode(), "model.safetensors": b"k" * 4096})
    life.artifact("other", repo=repo)
    for name, pinned in (("kept", True), ("unpinned", False)):
        create_prefetch(worker_kube, life.ns, name, "other", nodeNames=[plugin.node],
                        retention={"ttlAfterLastUse": "1s", "pinned": pinned})  # fmt: skip
    life.wait_state(plugin.node, "Ready", timeout=120)
    wait_for(lambda: (target_state(life.ns, "unpinned", plugin.node) or ("",))[0] == "Lapsed", timeout=60,
             message="the unpinned prefetch to lapse")  # fmt: skip
    assert target_state(life.ns, "kept", plugin.node) == ("Held", None)
    wait_condition(worker_kube, life.ns, "unpinned", "Lapsed", "True")
    assert conditions(worker_kube, life.ns, "kept")["Lapsed"]["status"] == "False"
    assert spec_item(worker_kube, plugin.node, life.digest) == {"digest": life.digest, "pinned": True}
    wait_for(lambda: not brief.exists(), timeout=COLLECTION_GRACE + 60, message="the lapsed content collected")
    assert life.tree(plugin).exists()
    # As its conditions say: a change of the spec places it again.
    retention = {"spec": {"retention": {"ttlAfterLastUse": "1h"}}}
    worker_kube.json("PATCH", f"{STORAGE}/namespaces/{life.ns}/modelprefetches/brief", body=retention,
                     content_type="application/merge-patch+json")  # fmt: skip
    wait_condition(worker_kube, life.ns, "brief", "Available", "True", timeout=120)
    assert conditions(worker_kube, life.ns, "brief")["Lapsed"]["status"] == "False"
    assert prefetch_status(worker_kube, life.ns, "brief")["lapsedNodes"] == 0


def lapsed_view(worker_kube, kubectl, ns: str, name: str) -> None:
    """A prefetch lapsed on its one node, as its status and ``kubectl get mpf`` show it."""
    wait_condition(worker_kube, ns, name, "Available", "False", reason="Lapsed")
    status = prefetch_status(worker_kube, ns, name)
    assert (status["readyNodes"], status["lapsedNodes"]) == (0, 1), status
    progressing, degraded = (
        conditions(worker_kube, ns, name)["Progressing"],
        conditions(worker_kube, ns, name)["Degraded"],
    )
    assert (progressing["status"], progressing["reason"]) == ("False", "Lapsed"), progressing
    assert "change the prefetch's spec" in progressing["message"]
    assert degraded["status"] == "False", degraded
    header, row = kubectl("get", "mpf", name, "-n", ns).stdout.splitlines()
    assert header.split()[:7] == ["NAME", "ARTIFACT", "DESIRED", "READY", "DOWNLOADING", "LAPSED", "AVAILABLE"]
    assert row.split()[2:7] == ["1", "0", "0", "1", "False"], row


def test_pressure_evicts_unreferenced_models_and_never_a_pinned_or_referenced_one(
    life, hub, worker_kube, core, mirror_db
):
    """Four 1 MiB models; two lose their prefetch. The plugin comes back with a volume of 4.2 of them: at 95 %
    it evicts both unreferenced ones (least recently used first) down to the 70 % low watermark."""
    allow_pinning(core, life.ns)
    (plugin,) = life.plugins(1, GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS=3600)
    trees, sizes = {}, {}
    for name in ("pinned", "held", "old", "newer"):
        life.files = {}
        life.repo = f"org/{name}-{uuid.uuid4().hex[:6]}"
        life.artifact(name, files=big_files(life.repo, mb=1))
        trees[name] = life.tree(plugin)
        create_prefetch(worker_kube, life.ns, name, name, nodeNames=[plugin.node],
                        retention={"pinned": name == "pinned"})  # fmt: skip
        sizes[name] = life.wait_state(plugin.node, "Ready", timeout=120)["sizeBytes"]
    for name in ("old", "newer"):
        worker_kube.delete(f"{STORAGE}/namespaces/{life.ns}/modelprefetches/{name}")
    wait_for(lambda: spec_item(worker_kube, plugin.node, life.digest) is None, timeout=60, message="newer unwanted")
    assert all(t.exists() for t in trees.values()), "the removal delay keeps the unreferenced trees"
    plugin.stop()
    capacity = int(sum(sizes.values()) * 4.2 / 4)
    restarted = life.start_plugin(
        plugin.node, plugin.address, GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS=3600, GPUSTACK_PLUGIN_CAPACITY_BYTES=capacity
    )
    wait_for(lambda: not trees["old"].exists() and not trees["newer"].exists(), timeout=60, message="evictions")
    assert trees["pinned"].exists() and trees["held"].exists()

    def low():
        got = (store(worker_kube, restarted.node).get("status") or {}).get("capacity") or {}
        return got if got.get("totalBytes") == capacity and got.get("usedPercent", 100) <= 70 else None

    wait_for(low, timeout=30, message="down to the low watermark")


def test_more_digests_than_the_cap_fill_its_places_and_a_pinned_model_still_lands(
    worker_stack, worker_api, hub, worker_kube, core, launcher, namespace, mirror_db
):
    """Two tenants prefetch four distinct digests more than the node's cap (the suite's worker: 16) onto one
    node: it is asked for the cap's worth, the rest say NodeFull, and another tenant's pinned prefetch (its
    namespace allowed to pin) displaces the youngest of them."""
    node = f"full-{uuid.uuid4().hex[:6]}"
    launcher.register_node(node, "127.0.3.1")  # a plugin Pod, no plugin process: nothing is downloaded
    count = MODELS_PER_NODE + 4
    tenants = tenants_of(core, -(-count // 10))
    namespaces = [ns for ns, _ in tenants]
    everything = {(namespaces[n // 10], f"p{n}") for n in range(count)}

    def models():
        return {m["digest"] for m in ((store(worker_kube, node) or {}).get("spec") or {}).get("models") or []}

    try:
        fill_past_the_cap(worker_kube, hub, node, namespaces, count)
        full = wait_for(lambda: len(nf := node_full(cap_prefetches(worker_kube, namespaces))) == 4 and nf,
                        timeout=120, interval=1, message="4 NodeFull")  # fmt: skip
        placed = cap_digests(worker_kube, everything - full)
        assert len(placed) == MODELS_PER_NODE
        wait_for(lambda: models() == placed, timeout=30, message="the cap's worth in spec.models")
        # Another tenant's pinned model still lands on the full node.
        allow_pinning(core, namespace)
        repo = f"org/pin-{uuid.uuid4().hex[:6]}"
        hub.add_hf_repo(repo, {"config.json": b"pinned"})
        worker_kube.create(
            f"{STORAGE}/namespaces/{namespace}/modelartifacts",
            {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": "vip"},
             "spec": {"source": {"huggingFace": {"repository": repo}}}},
        )  # fmt: skip
        create_prefetch(worker_kube, namespace, "vip", "vip", nodeNames=[node], retention={"pinned": True})
        digest = wait_for(
            lambda: (
                (worker_kube.get(f"{STORAGE}/namespaces/{namespace}/modelartifacts/vip").get("status") or {})
                .get("resolved", {})
                .get("manifestDigest")
            ),
            timeout=60,
            message="vip resolved",
        )
        items = wait_for(lambda: len(node_full(items := cap_prefetches(worker_kube, namespaces))) == 5 and items,
                         timeout=60, interval=1, message="5 NodeFull")  # fmt: skip
        after = node_full(items)
        assert full < after, "a prefetch left out came back"
        (displaced,) = after - full
        created = [items[key]["metadata"]["creationTimestamp"] for key in everything - after]
        assert items[displaced]["metadata"]["creationTimestamp"] >= max(created), "not the youngest left out"
        expected = placed - cap_digests(worker_kube, {displaced}) | {digest}
        wait_for(lambda: models() == expected, timeout=30, message="the pinned model in place of the youngest")
        assert spec_item(worker_kube, node, digest) == {"digest": digest, "pinned": True}
        wait_condition(worker_kube, namespace, "vip", "Degraded", "False")
    finally:
        launcher.unregister_node(node)
        for _, gen in tenants:
            next(gen, None)
        settled(node, namespaces)


def settled(node, namespaces):
    """Wait for the worker to digest the teardown, so the next test's waits measure its own work and not
    this test's backlog."""
    from gpustack_models.models import Holding, Prefetch

    def done():
        live = Prefetch.objects.live().filter(namespace__in=namespaces).exists()
        return not live and not Holding.objects.filter(node=node).exists()

    wait_for(done, timeout=120, interval=1, message="the worker to finish the teardown")


def test_status_a_tenant_can_act_on(worker_stack, worker_api, hub, worker_kube, core, launcher, namespace):
    node = f"quota-{uuid.uuid4().hex[:6]}"
    launcher.register_node(node, "127.0.3.2")
    repo = f"org/st-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {"config.json": b"{}", "model.safetensors": b"w" * 5000})
    kinds = {
        "good": {"huggingFace": {"repository": repo}},
        "claim": {"persistentVolumeClaim": {"claimName": "models"}},
    }
    for name, source in kinds.items():
        worker_kube.create(
            f"{STORAGE}/namespaces/{namespace}/modelartifacts",
            {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": name},
             "spec": {"source": source}},
        )  # fmt: skip
    worker_kube.create(
        f"{STORAGE}/namespaces/{namespace}/modelartifacts",
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": "nomatch"},
         "spec": {"source": {"huggingFace": {"repository": repo}}, "allowPatterns": ["*.GGUF"]}},
    )  # fmt: skip
    try:
        create_prefetch(worker_kube, namespace, "ghost", "good", nodeNames=["no-such-node"])
        cond = wait_condition(worker_kube, namespace, "ghost", "Degraded", "True", "NodeNotFound")
        assert "no-such-node" in cond["message"]
        assert conditions(worker_kube, namespace, "ghost")["Progressing"]["status"] == "False"

        create_prefetch(worker_kube, namespace, "broken", "nomatch", nodeNames=[node])
        cond = wait_condition(worker_kube, namespace, "broken", "Degraded", "True", "EmptyManifest")
        assert "not resolved" in cond["message"]

        create_prefetch(worker_kube, namespace, "volume", "claim", nodeNames=[node])
        cond = wait_condition(worker_kube, namespace, "volume", "Degraded", "True", "UnsupportedSource")
        assert "PersistentVolumeClaim" in cond["message"]

        # The namespace may place 1,000 bytes per node; the model is 5 KB.
        core.patch_namespace(namespace, {"metadata": {"annotations": {f"{GROUP}/prefetch-bytes-per-node": "1000"}}})
        create_prefetch(worker_kube, namespace, "big", "good", nodeNames=[node])
        cond = wait_condition(worker_kube, namespace, "big", "Degraded", "True", "QuotaExceeded")
        assert "1 of 1 nodes QuotaExceeded" in cond["message"]
        assert store(worker_kube, node)["spec"]["models"] == []
        # Raised by the administrator: placed.
        core.patch_namespace(namespace, {"metadata": {"annotations": {f"{GROUP}/prefetch-bytes-per-node": "10000"}}})
        wait_condition(worker_kube, namespace, "big", "Degraded", "False")
        wait_for(lambda: len(store(worker_kube, node)["spec"]["models"]) == 1, message="placed within the limit")
    finally:
        launcher.unregister_node(node)


def events_of(core, name, uid):
    found = core.list_event_for_all_namespaces(field_selector=f"involvedObject.name={name},involvedObject.uid={uid}")
    return found.items


def test_a_failing_node_degrades_the_artifact_and_describe_tells_the_story(life, hub, worker_kube, core, kubectl):
    life.artifact()
    (plugin,) = life.plugins(1, GPUSTACK_PLUGIN_RETRY_BASE=1)
    hub.faults.fail(life.repo, 503, times=None)
    hub.faults.fail(life.weights, 503, times=None)
    life.prefetch([plugin])
    life.wait_state(plugin.node, "Failed", reason="SourceUnavailable")
    art_path = f"{STORAGE}/namespaces/{life.ns}/modelartifacts/art"

    def degraded(status):
        obj = worker_kube.get(art_path)
        cond = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}.get("Degraded")
        return cond if cond and cond["status"] == status else None

    cond = wait_for(lambda: degraded("True"), message="the artifact Degraded")
    assert cond["reason"] == "SourceUnavailable" and "1 of 1 nodes failed (SourceUnavailable: 1)" in cond["message"]
    assert plugin.node not in cond["message"]
    store_uid = store(worker_kube, plugin.node)["metadata"]["uid"]

    def failures():  # retried with backoff: every failure joins one Event series
        found = [e for e in events_of(core, plugin.node, store_uid) if e.reason == "DownloadFailed"]
        return found if found and sum(e.count or 1 for e in found) >= 3 else None

    assert len(wait_for(failures, timeout=90, message="three failures recorded")) == 1
    hub.faults.clear()
    life.wait_state(plugin.node, "Ready", timeout=120)
    wait_for(lambda: degraded("False"), message="the artifact recovered")

    described = kubectl("describe", "mart", "art", "-n", life.ns).stdout
    for reason in ("Resolved", "Degraded", "Recovered"):
        assert reason in described, described
    assert plugin.node not in described.split("Events:")[1], "a tenant's Events name a node"
    described = kubectl("describe", "mpf", "warm", "-n", life.ns).stdout
    assert "TargetsChanged" in described and "Available" in described.split("Events:")[1], described
    described = kubectl("describe", "nms", plugin.node).stdout
    events = described.split("Events:")[1]
    assert "DownloadStarted" in events and "DownloadFailed" in events and "DownloadReady" in events, described
