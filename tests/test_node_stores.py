"""NodeModelStore lifecycle, desired contents from ModelPrefetch, and the artifacts' status.nodes roll-up."""

import uuid

from gpustack_models.kinds import GROUP
from tests.support import wait_for
from tests.support.stores import digests, entry, place, prefetch, put_entries, store

STORAGE = f"/apis/{GROUP}/v1alpha1"


def test_it_creates_a_store_owned_by_each_node_running_the_plugin(nodes, worker_kube, core):
    for name in nodes:
        obj = wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")
        (owner,) = obj["metadata"]["ownerReferences"]
        node = core.read_node(name)
        assert owner == {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
        assert "blockOwnerDeletion" not in owner
        assert obj["spec"]["models"] == []
        assert obj["spec"]["watermarks"] == {"highPercent": 80, "lowPercent": 70}


def test_it_gives_no_store_to_a_node_without_the_plugin(worker_stack, worker_kube, core, launcher):
    from kubernetes import client as k8s

    name = f"bare-{uuid.uuid4().hex[:6]}"
    core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        plugged = f"plug-{uuid.uuid4().hex[:6]}"
        launcher.register_node(plugged, "127.0.0.99")
        wait_for(lambda: store(worker_kube, plugged), timeout=30, message="the plugged node's store")
        assert store(worker_kube, name) is None
        launcher.unregister_node(plugged)
    finally:
        core.delete_node(name)


def test_it_puts_a_prefetched_digest_on_exactly_the_named_nodes(nodes, resolved, worker_kube, namespace):
    artifact, digest = resolved
    a, b, c = nodes
    for name in nodes:
        wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")
    prefetch(worker_kube, namespace, "warm", artifact, [a, b])
    for name in (a, b):
        wait_for(
            lambda name=name: digests(store(worker_kube, name)) == [digest], timeout=30, message=f"{name} to want it"
        )
    assert digests(store(worker_kube, c)) == []

    def status():
        obj = worker_kube.get(f"{STORAGE}/namespaces/{namespace}/modelprefetches/warm")
        return obj.get("status", {}).get("desiredNodes") == 2 and obj["status"]

    st = wait_for(status, timeout=30, message="the prefetch status")
    assert st["readyNodes"] == 0 and st["downloadingNodes"] == 0
    assert {c["type"] for c in st["conditions"]} == {"Available", "Progressing", "Degraded", "Lapsed", "Pinned"}

    # A deleted store comes back, owned by its node, with the same spec.models at once.
    worker_kube.delete(f"{STORAGE}/nodemodelstores/{a}")
    back = wait_for(
        lambda: (s := store(worker_kube, a)) and s["metadata"].get("deletionTimestamp") is None and s,
        timeout=10,
        interval=0.1,
        message="the store to come back within 10 s",
    )
    assert digests(back) == [digest]
    assert back["metadata"]["ownerReferences"][0]["name"] == a

    worker_kube.delete(f"{STORAGE}/namespaces/{namespace}/modelprefetches/warm")
    for name in (a, b):
        wait_for(lambda name=name: digests(store(worker_kube, name)) == [], timeout=30, message=f"{name} to drop it")


def test_it_rolls_entries_up_into_status_nodes(nodes, resolved, worker_kube, namespace, cluster, mirror_db):
    from gpustack_models.models import StoreEntry

    artifact, digest = resolved
    a, b, c = nodes
    url = f"{STORAGE}/namespaces/{namespace}/modelartifacts/{artifact}"
    for name in nodes:
        wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")

    def rolled(expected):
        def check():
            got = (worker_kube.get(url).get("status") or {}).get("nodes")
            return got if got == expected else None

        return wait_for(check, timeout=60, message=f"status.nodes == {expected}")

    def rollup_writes(since: int) -> list[dict]:
        return [
            e
            for e in cluster.audit_events()[since:]
            if e["stage"] == "ResponseComplete"
            and e["verb"] == "patch"
            and e.get("objectRef", {}).get("subresource") == "status"
            and e["objectRef"].get("name") == artifact
            and e["objectRef"].get("namespace") == namespace
            and "fieldManager=gpustack-models-rollup" in e["requestURI"]
        ]

    place(worker_kube, namespace, artifact, digest, nodes)  # entries count where the digest was placed
    put_entries(worker_kube, a, [entry(digest, "Downloading", 100)])
    put_entries(worker_kube, b, [entry(digest, "Ready", 1000)])
    rolled({"ready": 1, "downloading": 1, "failed": 0, "downloadingPercent": 10})
    # 12 % stays within the 10 % step: not written.
    put_entries(worker_kube, a, [entry(digest, "Downloading", 120)])
    put_entries(worker_kube, c, [entry(digest, "Failed", reason="SourceUnavailable")])
    rolled({"ready": 1, "downloading": 1, "failed": 1, "downloadingPercent": 12})
    # The failed count changed at once (and carried the current percent along). Now 14 %: no write; 16 %: one.
    mark = len(cluster.audit_events())
    put_entries(worker_kube, a, [entry(digest, "Downloading", 140)])
    wait_for(
        lambda: StoreEntry.objects.filter(node=a, digest=digest, downloaded_bytes=140).exists(),
        timeout=20,
        message="the mirror to hold 14 %",
    )
    put_entries(worker_kube, a, [entry(digest, "Downloading", 160)])
    rolled({"ready": 1, "downloading": 1, "failed": 1, "downloadingPercent": 16})
    assert len(rollup_writes(mark)) == 1, "14 % was written although it stays within the step"
    put_entries(worker_kube, a, [entry(digest, "Ready", 1000)])
    rolled({"ready": 2, "downloading": 0, "failed": 1})
