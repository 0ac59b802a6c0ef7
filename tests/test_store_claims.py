"""A node's report is a claim about itself only. A node writes its store's status with its own plugin's
token (all a compromised node holds): entries for a digest it was never given count nowhere a tenant
sees (the artifact's status and conditions, its Events, ``progress``, the console's tenant numbers, Pods'
affinity, another node's fetch ticket); a failure reason outside the fixed set is refused by
kube-apiserver; its free text reaches no tenant's condition or Event. An entry counts once its digest is
placed on the node, reported before or after, and stops counting when the digest leaves spec.models."""

import json
import uuid

import pytest

from gpustack_models.kinds import GROUP
from tests.support import wait_for
from tests.support.kubernetes import read_modify_write, token_http
from tests.support.stores import STORAGE, digests, entry, place, prefetch, store
from tests.support.worker import COLLECTION_GRACE

HOSTILE = "<img src=x onerror=alert(1)> your token expired: call +1-555-0100 or visit https://evil.example/fix"
MARKERS = ("onerror", "555-0100", "evil.example")
DEGRADED_OK = ("False", "AsExpected")


@pytest.fixture
def plugin_nodes(worker_stack, launcher):
    """Five fresh nodes, each running the plugin (as a kubelet would report it)."""
    names = [f"c-{uuid.uuid4().hex[:6]}-{i}" for i in range(5)]
    for i, name in enumerate(names):
        launcher.register_node(name, f"127.0.1.{40 + i}")
    yield names
    for name in names:
        launcher.unregister_node(name)


def as_node(cluster, launcher, node):
    """A session with ``node``'s plugin token: what a compromised node holds."""
    return token_http(cluster, launcher.plugin_token(node))


def report(cluster, launcher, node, entries):
    """``node`` writes its own store's status.models with its own token; the response."""
    path = f"{cluster.server}{STORAGE}/nodemodelstores/{node}/status"
    return read_modify_write(as_node(cluster, launcher, node), path, lambda obj: dict(obj, status={"models": entries}))


def reported(cluster, launcher, node, entries):
    resp = report(cluster, launcher, node, entries)
    assert resp.status_code == 200, resp.text
    return resp.json()


def hostile_failure(digest):
    return dict(entry(digest, "Failed", reason="SourceUnavailable"), message=HOSTILE)


def artifact_of(worker_kube, namespace, artifact):
    return worker_kube.get(f"{STORAGE}/namespaces/{namespace}/modelartifacts/{artifact}")


def nodes_rolled(worker_kube, namespace, artifact, done):
    """The artifact once its status.nodes satisfies ``done``."""

    def check():
        obj = artifact_of(worker_kube, namespace, artifact)
        return done((obj.get("status") or {}).get("nodes") or {}) and obj

    return wait_for(check, timeout=60, message="the artifact's status.nodes")


def degraded(obj):
    cond = next((c for c in obj["status"].get("conditions") or [] if c["type"] == "Degraded"), {})
    return cond.get("status"), cond.get("reason")


def progress_of(admin_http, cluster, namespace, artifact):
    resp = admin_http.get(f"{cluster.server}/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts/{artifact}/progress")
    assert resp.status_code == 200, resp.text
    return resp.json()


def ticket(worker_api, launcher, node, digest):
    session = worker_api.session(token=launcher.plugin_token(node))
    resp = session.post(f"{worker_api.url}/internal/v1/tickets", json={"node": node, "digest": digest})
    assert resp.status_code == 200, resp.text
    return resp.json()


def assert_nowhere(text, names):
    for marker in (*MARKERS, *names):
        assert marker not in text, f"{marker!r} reached a tenant: {text[:2000]}"


def test_entries_of_a_digest_a_node_was_never_given_count_nowhere_a_tenant_sees(
    plugin_nodes, resolved, worker_kube, worker_api, namespace, cluster, launcher, core, admin_http, mirror_db
):
    from gpustack_models.console import queries
    from gpustack_models.models import StoreEntry
    from gpustack_models.webhooks import placement

    artifact, digest = resolved
    honest, asker, *claimers = plugin_nodes
    for name in plugin_nodes:
        wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")
    place(worker_kube, namespace, artifact, digest, [honest, asker])
    reported(cluster, launcher, honest, [entry(digest, "Downloading", 500)])
    reported(cluster, launcher, asker, [entry(digest, "Downloading", 100)])
    nodes_rolled(worker_kube, namespace, artifact, lambda n: n.get("downloading") == 2)

    # Three nodes never given the digest claim it: Ready, Downloading, Failed with a hostile message.
    ready, downloading, failed = claimers
    reported(cluster, launcher, ready, [entry(digest, "Ready", 1000)])
    reported(cluster, launcher, downloading, [entry(digest, "Downloading", 900)])
    reported(cluster, launcher, failed, [hostile_failure(digest)])
    wait_for(
        lambda: StoreEntry.objects.filter(digest=digest, node__in=claimers).count() == 3,
        timeout=30,
        message="the claims mirrored",
    )
    # Then the honest node finishes: the roll-up that shows it ran after the claims were mirrored.
    reported(cluster, launcher, honest, [entry(digest, "Ready", 1000)])
    obj = nodes_rolled(worker_kube, namespace, artifact, lambda n: n.get("ready", 0) >= 1)

    assert obj["status"]["nodes"] == {"ready": 1, "downloading": 1, "failed": 0, "downloadingPercent": 10}
    assert degraded(obj) == DEGRADED_OK
    assert_nowhere(json.dumps(obj), claimers)
    events = core.list_namespaced_event(namespace).items
    assert [e.reason for e in events if e.type == "Warning"] == []
    assert_nowhere(json.dumps([e.message for e in events]), claimers)

    answer = progress_of(admin_http, cluster, namespace, artifact)
    got = {k: answer[k] for k in ("ready", "downloading", "failed", "downloadingBytes", "failureReasons")}
    assert got == {"ready": 1, "downloading": 1, "failed": 0, "downloadingBytes": 100, "failureReasons": []}
    assert_nowhere(json.dumps(answer), claimers)

    numbers = queries.progress([digest])[digest]
    assert (numbers["ready"], numbers["downloading"], numbers["failed"], numbers["reasons"]) == (1, 1, 0, [])
    (tenant,) = queries.tenants(namespace)
    assert (tenant["ready_nodes"], tenant["downloading_nodes"], tenant["failed_nodes"]) == (1, 1, 0)
    assert placement.holders(namespace, [artifact]) == [[honest]]  # Pods are drawn to the honest node only

    answer = ticket(worker_api, launcher, asker, digest)
    assert [p["node"] for p in answer["peers"]] == [honest] and answer["joining"] == 0
    # The claims stay the node's own: on its store, for administrators.
    own = store(worker_kube, failed)["status"]["models"]
    assert own[0]["message"] == HOSTILE


def test_a_placed_nodes_failure_reaches_tenants_as_a_fixed_reason_and_a_count_only(
    plugin_nodes, resolved, worker_kube, worker_api, namespace, cluster, launcher, core, admin_http
):
    artifact, digest = resolved
    honest, failing = plugin_nodes[:2]
    for name in (honest, failing):
        wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")
    place(worker_kube, namespace, artifact, digest, [honest, failing])
    reported(cluster, launcher, honest, [entry(digest, "Ready", 1000)])
    reported(cluster, launcher, failing, [hostile_failure(digest)])

    def degraded_now():
        obj = artifact_of(worker_kube, namespace, artifact)
        return degraded(obj) == ("True", "SourceUnavailable") and obj

    obj = wait_for(degraded_now, timeout=60, message="the artifact Degraded")
    (cond,) = [c for c in obj["status"]["conditions"] if c["type"] == "Degraded"]
    assert cond["message"] == "1 of 2 nodes failed (SourceUnavailable: 1)"
    assert_nowhere(json.dumps(obj), [honest, failing])

    def warned():
        found = [e for e in core.list_namespaced_event(namespace).items if e.reason == "Degraded"]
        return found

    (event,) = wait_for(warned, timeout=30, message="the Degraded Event")
    assert (event.type, event.message) == ("Warning", cond["message"])
    assert_nowhere(json.dumps([e.message for e in core.list_namespaced_event(namespace).items]), [honest, failing])
    answer = progress_of(admin_http, cluster, namespace, artifact)
    assert answer["failureReasons"] == [{"reason": "SourceUnavailable", "count": 1}]
    assert_nowhere(json.dumps(answer), [honest, failing])
    assert store(worker_kube, failing)["status"]["models"][0]["message"] == HOSTILE  # for administrators


@pytest.mark.parametrize("reason", ["DiskOnFire", "call +1-555-0100", "sourceunavailable"])
def test_a_reason_outside_the_fixed_set_is_refused_by_kube_apiserver_and_changes_nothing(
    reason, plugin_nodes, resolved, worker_kube, namespace, cluster, launcher, mirror_db
):
    from gpustack_models.models import StoreEntry

    artifact, digest = resolved
    node = plugin_nodes[0]
    wait_for(lambda: store(worker_kube, node), timeout=30, message="the store")
    place(worker_kube, namespace, artifact, digest, [node])
    before = reported(cluster, launcher, node, [entry(digest, "Downloading", 100)])
    rv = before["metadata"]["resourceVersion"]
    wait_for(
        lambda: StoreEntry.objects.filter(node=node, digest=digest, state="Downloading").exists(),
        timeout=30,
        message="the entry mirrored",
    )

    resp = report(cluster, launcher, node, [entry(digest, "Failed", reason=reason)])
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert (body["kind"], body["reason"]) == ("Status", "Invalid")
    named = {c.get("field") for c in body["details"]["causes"]} - {None, "<nil>"}  # "<nil>": rules not run
    assert named == {"status.models[0].reason"} and "Unsupported value" in body["message"], body
    after = store(worker_kube, node)
    assert after["metadata"]["resourceVersion"] == rv and after["status"] == before["status"]
    assert list(StoreEntry.objects.filter(node=node).values_list("digest", "state", "reason")) == [
        (digest, "Downloading", "")
    ]


def test_an_entry_counts_from_the_placement_of_its_digest_until_it_leaves_spec_models(
    plugin_nodes, resolved, worker_kube, worker_api, namespace, cluster, launcher, admin_http, mirror_db
):
    from gpustack_models.models import StoreEntry

    artifact, digest = resolved
    honest, late = plugin_nodes[:2]
    for name in (honest, late):
        wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")
    place(worker_kube, namespace, artifact, digest, [honest])
    reported(cluster, launcher, honest, [entry(digest, "Downloading", 100)])
    nodes_rolled(worker_kube, namespace, artifact, lambda n: n.get("downloading") == 1)
    # ``late`` reports the digest Ready before it is placed there (its reconcile came after): nothing yet.
    reported(cluster, launcher, late, [entry(digest, "Ready", 1000)])
    wait_for(lambda: StoreEntry.objects.filter(node=late, digest=digest).exists(), timeout=30, message="mirrored")
    assert progress_of(admin_http, cluster, namespace, artifact)["ready"] == 0

    prefetch(worker_kube, namespace, "late", artifact, [late])
    obj = nodes_rolled(worker_kube, namespace, artifact, lambda n: n.get("ready") == 1)
    assert obj["status"]["nodes"] == {"ready": 1, "downloading": 1, "failed": 0, "downloadingPercent": 10}

    # Unreferenced, the digest stays in spec.models for the collection grace, and counts; then it leaves.
    worker_kube.delete(f"{STORAGE}/namespaces/{namespace}/modelprefetches/late")

    def in_grace():
        models = (store(worker_kube, late) or {}).get("spec", {}).get("models") or []
        return any(m["digest"] == digest and m.get("collectTime") for m in models)

    wait_for(in_grace, timeout=30, message="the digest under the collection grace")
    ready = progress_of(admin_http, cluster, namespace, artifact)["ready"]
    if digest in digests(store(worker_kube, late)):  # read within the grace (it is 8 s): it counted
        assert ready == 1
    wait_for(
        lambda: digest not in digests(store(worker_kube, late)),
        timeout=COLLECTION_GRACE + 30,
        message="the digest to leave spec.models",
    )
    nodes_rolled(worker_kube, namespace, artifact, lambda n: n == {"ready": 0, "downloading": 1, "failed": 0,
                                                                     "downloadingPercent": 10})  # fmt: skip
    assert progress_of(admin_http, cluster, namespace, artifact)["ready"] == 0


@pytest.mark.django_db
def test_the_console_shows_a_nodes_claim_to_administrators_only_escaped_and_counts_it_nowhere(admin_client):
    from django.urls import reverse

    from gpustack_models.models import Artifact, Holding, NodeStore, StoreEntry

    digest, ns = "sha256:" + uuid.uuid4().hex * 2, f"tenant-{uuid.uuid4().hex[:6]}"
    art = Artifact.objects.create(namespace=ns, name="art", resource_version=1, digest=digest, resolved_status="True")
    rows = {}
    for node, state in (("honest-node", "Ready"), ("claiming-node", "Failed")):
        rows[node] = NodeStore.objects.create(name=node, resource_version=1, total_bytes=100)
        StoreEntry.objects.create(
            store=rows[node], node=node, digest=digest, state=state, size_bytes=10, downloaded_bytes=10,
            reason="SourceUnavailable" if state == "Failed" else "", message=HOSTILE if state == "Failed" else "",
        )  # fmt: skip
    Holding.objects.create(node="honest-node", digest=digest)

    tenant = admin_client.get(reverse("admin:tenant", args=[ns])).content.decode()
    for cell, value in (("ready", 1), ("downloading", 0), ("failed", 0)):
        assert f'<td class="{cell}">{value}</td>' in tenant, tenant
    assert "SourceUnavailable" not in tenant
    artifact_page = admin_client.get(reverse("admin:artifact", args=[art.namespace, art.name])).content.decode()
    assert "honest-node" in artifact_page and "claiming-node" not in artifact_page
    assert_nowhere(artifact_page + tenant, ["claiming-node"])
    node_page = admin_client.get(reverse("admin:node", args=["claiming-node"])).content.decode()
    assert "not placed on this node" in node_page and "&lt;img src=x onerror=alert(1)&gt;" in node_page
    assert "<img src=x" not in node_page  # the node's text, escaped
