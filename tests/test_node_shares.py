"""A node's places shared between tenants, with the real worker (API process, Celery worker and beat) and the
control plane: a Pod's mount takes a place before any prefetch, however many pinned prefetches a tenant
makes; a namespace's prefetches get at most its share of a node's digests; a prefetch pins only where an
administrator allowed its namespace to, which its tenant cannot do. The suite's worker caps a node at 16
digests; nodes are registered with a plugin Pod and no plugin process (nothing is downloaded)."""

from __future__ import annotations

import uuid

import requests
from kubernetes import client as k8s

from gpustack_models.kinds import GROUP
from tests.support import token_http, wait_for
from tests.support.stores import cap_prefetches, tenants_of
from tests.support.worker import MODELS_PER_NODE
from tests.test_api_authz import bind

STORAGE = f"/apis/{GROUP}/v1alpha1"
PINNING = f"{GROUP}/pinning-allowed"
DIGESTS = f"{GROUP}/prefetch-digests-per-node"
SHARE = MODELS_PER_NODE // 2  # each attacking namespace's share: two of them fill a node
PER_NAMESPACE = SHARE + 2  # pinned prefetches each attacking namespace makes: two past its share


def annotate(core, namespace: str, annotations: dict) -> None:
    """An administrator annotates the Namespace (tenants cannot: they have no write on Namespaces)."""
    core.patch_namespace(namespace, {"metadata": {"annotations": annotations}})


def mirrored(namespace: str, key: str, value: str) -> None:
    from gpustack_models.models import Namespace

    def seen():
        row = Namespace.objects.live().filter(name=namespace).first()
        return row is not None and ((row.body.get("metadata") or {}).get("annotations") or {}).get(key) == value

    wait_for(seen, timeout=30, message=f"{namespace}'s {key}={value} in the worker's mirror")


def pinned_prefetch(kube_client, namespace: str, name: str, artifact: str, node: str) -> dict:
    return kube_client.create(
        f"{STORAGE}/namespaces/{namespace}/modelprefetches",
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelPrefetch", "metadata": {"name": name},
         "spec": {"artifactRef": {"name": artifact}, "nodeNames": [node], "retention": {"pinned": True}}},
    )  # fmt: skip


def pin_tiny_artifacts(kube_client, hub, node: str, namespaces: list[str], count: int) -> None:
    """``count`` tiny artifacts of distinct digests in each of ``namespaces`` (at most a namespace's burst
    of resolutions), each pinned onto ``node`` by ``p<n>``."""
    repo = f"org/pins-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {f"f{i:03d}.json": f"{repo} {i}".encode() for i in range(count * len(namespaces))})
    for k, namespace in enumerate(namespaces):
        for n in range(count):
            kube_client.create(
                f"{STORAGE}/namespaces/{namespace}/modelartifacts",
                {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": f"a{n}"},
                 "spec": {"source": {"huggingFace": {"repository": repo}},
                          "allowPatterns": [f"f{k * count + n:03d}.json"]}},
            )  # fmt: skip
            pinned_prefetch(kube_client, namespace, f"p{n}", f"a{n}", node)


def conditions(item: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (item.get("status") or {}).get("conditions") or []}


def degraded(items: dict, reason: str) -> set[tuple[str, str]]:
    return {key for key, item in items.items() if conditions(item).get("Degraded", {}).get("reason") == reason}


def test_a_tenants_pinned_prefetches_cannot_keep_another_tenants_mount_off_a_node(mounts, hub, core):
    """Tenant A (two namespaces an administrator allowed to pin, a share of half a node's places each) pins
    more tiny artifacts onto a node than it holds. A's pins take the node's every place; those past each
    namespace's share are QuotaExceeded. Tenant B's Pod then mounts its artifact there: its digest takes a
    place, and the youngest of A's pins is left out (NodeFull) instead."""
    tenants = tenants_of(core, 2)
    attackers = [ns for ns, _ in tenants]
    try:
        for ns in attackers:
            annotate(core, ns, {PINNING: "true", DIGESTS: str(SHARE)})
            mirrored(ns, DIGESTS, str(SHARE))
        pin_tiny_artifacts(mounts.kube, hub, mounts.node, attackers, PER_NAMESPACE)
        everything = {(ns, f"p{n}") for ns in attackers for n in range(PER_NAMESPACE)}

        def full():
            items = cap_prefetches(mounts.kube, attackers)
            left_out = degraded(items, "QuotaExceeded") | degraded(items, "NodeFull")
            models = mounts.models()
            return len(left_out) == len(everything) - MODELS_PER_NODE and len(models) == MODELS_PER_NODE and models

        models = wait_for(full, timeout=120, interval=1, message="A's pins filling the node")
        assert all(m["pinned"] for m in models), models
        assert mounts.digest not in {m["digest"] for m in models}

        assert mounts.post(mounts.body(mounts.pod())).status_code == 200
        wait_for(lambda: mounts.item(mounts.digest), timeout=30, message="B's mounted digest placed on the full node")
        assert mounts.item(mounts.digest) == {"digest": mounts.digest, "pinned": False}

        def one_left_out():
            items = cap_prefetches(mounts.kube, attackers)
            return len(degraded(items, "NodeFull")) == 1 and items

        items = wait_for(one_left_out, timeout=30, interval=1, message="one of A's pins left out for B's mount")
        assert len(mounts.models()) == MODELS_PER_NODE

        over = degraded(items, "QuotaExceeded")
        assert sorted(ns for ns, _ in over) == sorted(attackers * 2), "two past each namespace's share"
        for ns, name in over:
            held = [items[ns, f"p{n}"]["metadata"]["creationTimestamp"] for n in range(PER_NAMESPACE)
                    if (ns, f"p{n}") not in over]  # fmt: skip
            assert items[ns, name]["metadata"]["creationTimestamp"] >= max(held), "not the youngest left out"
            message = conditions(items[ns, name])["Degraded"]["message"]
            assert "1 of 1 nodes QuotaExceeded (past the namespace's limit of bytes or models per node)" in message
    finally:
        for _, gen in tenants:
            next(gen, None)
        _settled(attackers)


def test_a_pin_holds_only_where_an_administrator_allowed_it_and_a_tenant_cannot_allow_it(
    mounts,
    core,
    api_client,
    cluster,
):
    """A tenant with every right on the models' kinds in its namespace, and on its Namespace what Kubernetes'
    own ``admin`` role gives (read), pins a prefetch there: it is prefetched unpinned and says
    PinningNotAllowed. It cannot annotate its Namespace; once an administrator does, the pin holds."""
    ns, node = mounts.ns, mounts.nodes[1]
    rules = [
        k8s.V1PolicyRule(api_groups=[GROUP], resources=["*"], verbs=["*"]),
        k8s.V1PolicyRule(api_groups=[""], resources=["namespaces"], verbs=["get", "list", "watch"]),
    ]
    bind(api_client, ns, "User", "dave", rules, name="namespace-owner")
    dave = token_http(cluster, cluster.tokens()["dave"])
    url = f"{cluster.server}/apis/{GROUP}/v1/namespaces/{ns}/modelprefetches"
    spec = {"artifactRef": {"name": mounts.artifact}, "nodeNames": [node], "retention": {"pinned": True}}
    body = {"apiVersion": f"{GROUP}/v1", "kind": "ModelPrefetch", "metadata": {"name": "keep"}, "spec": spec}
    wait_for(lambda: dave.post(url, json=body).status_code == 201, timeout=20, message="dave's prefetch created")

    def pinned_condition(reason):
        obj = mounts.kube.get(f"{STORAGE}/namespaces/{ns}/modelprefetches/keep")
        cond = conditions(obj).get("Pinned") or {}
        return cond.get("reason") == reason and cond

    refused = wait_for(lambda: pinned_condition("PinningNotAllowed"), timeout=30, message="Pinned=PinningNotAllowed")
    assert refused["status"] == "False" and PINNING in refused["message"]
    warned = wait_for(lambda: [e for e in core.list_namespaced_event(ns).items if e.reason == "PinningNotAllowed"],
                      timeout=30, message="a PinningNotAllowed Event")  # fmt: skip
    assert [(e.type, e.involved_object.name) for e in warned] == [("Warning", "keep")]
    wait_for(lambda: mounts.item(mounts.digest, node), timeout=30, message="the prefetch placed on its node")
    assert mounts.item(mounts.digest, node) == {"digest": mounts.digest, "pinned": False}

    for annotation, value in ((PINNING, "true"), (DIGESTS, "0")):
        patch = {"metadata": {"annotations": {annotation: value}}}
        denied = _merge_patch(dave, f"{cluster.server}/api/v1/namespaces/{ns}", patch)
        assert denied.status_code == 403, denied.text
        assert denied.json()["reason"] == "Forbidden"
    assert dave.get(f"{cluster.server}/api/v1/namespaces/{ns}").status_code == 200, "it reads its Namespace"
    assert not (core.read_namespace(ns).metadata.annotations or {}).keys() & {PINNING, DIGESTS}

    annotate(core, ns, {PINNING: "true"})
    held = wait_for(lambda: pinned_condition("Pinned"), timeout=30, message="Pinned=True once an administrator allows")
    assert held["status"] == "True"
    wait_for(lambda: mounts.item(mounts.digest, node) == {"digest": mounts.digest, "pinned": True}, timeout=30,
             message="the digest pinned in spec.models")  # fmt: skip


def _merge_patch(session: requests.Session, url: str, patch: dict) -> requests.Response:
    return session.patch(url, json=patch, headers={"Content-Type": "application/merge-patch+json"}, timeout=30)


def _settled(namespaces):
    """Wait for the worker to digest the teardown, so the next test's waits measure its own work."""
    from gpustack_models.models import Prefetch

    wait_for(lambda: not Prefetch.objects.live().filter(namespace__in=namespaces).exists(), timeout=120, interval=1,
             message="the worker to finish the teardown")  # fmt: skip
