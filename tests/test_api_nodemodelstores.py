"""NodeModelStores at v1: read and delete only, with Kubernetes garbage collection working."""

import json
import uuid

import pytest

from gpustack_models import kube
from gpustack_models.kinds import GROUP
from tests.support import wait_for

DIGEST = "sha256:" + "ef" * 32
STORAGE = f"/apis/{GROUP}/v1alpha1/nodemodelstores"


def make_store(worker_kube, name, owner=None):
    body = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "NodeModelStore",
        "metadata": {"name": name},
        "spec": {"models": [{"digest": DIGEST}]},
    }
    if owner:
        body["metadata"]["ownerReferences"] = [owner]
    return worker_kube.create(STORAGE, body)


@pytest.fixture
def store(worker_kube):
    name = f"node-{uuid.uuid4().hex[:8]}"
    make_store(worker_kube, name)
    yield name
    try:
        worker_kube.delete(f"{STORAGE}/{name}")
    except kube.NotFound:  # deleted by the test itself
        pass


def test_it_refuses_create_and_update(worker_api, admin_http, cluster, store):
    url = f"{cluster.server}/apis/{GROUP}/v1/nodemodelstores"
    body = {"apiVersion": f"{GROUP}/v1", "kind": "NodeModelStore", "metadata": {"name": "new"}, "spec": {}}
    created = admin_http.post(url, json=body)
    assert created.status_code == 405 and created.json()["reason"] == "MethodNotAllowed"
    current = admin_http.get(f"{url}/{store}").json()
    current["spec"]["models"] = []
    updated = admin_http.put(f"{url}/{store}", json=current)
    assert updated.status_code == 405


@pytest.mark.parametrize(
    "content_type,patch",
    [
        ("application/merge-patch+json", {"spec": {"models": []}}),
        ("application/merge-patch+json", {"metadata": {"labels": {"x": "y"}}}),
        ("application/json-patch+json", [{"op": "replace", "path": "/spec/models", "value": []}]),
        (
            "application/apply-patch+yaml",
            {"apiVersion": f"{GROUP}/v1", "kind": "NodeModelStore", "metadata": {"name": "x"}},
        ),
    ],
)
def test_it_refuses_a_patch_beyond_finalizers_and_owner_references(
    worker_api, admin_http, cluster, store, content_type, patch
):
    resp = admin_http.patch(
        f"{cluster.server}/apis/{GROUP}/v1/nodemodelstores/{store}",
        data=json.dumps(patch),
        headers={"Content-Type": content_type},
    )
    assert resp.status_code == 405, resp.text
    assert resp.json()["reason"] == "MethodNotAllowed"


def test_it_takes_a_finalizer_patch_like_the_garbage_collector_sends(worker_api, admin_http, cluster, store):
    url = f"{cluster.server}/apis/{GROUP}/v1/nodemodelstores/{store}"
    resp = admin_http.patch(
        url,
        data=json.dumps({"metadata": {"finalizers": ["example.com/x"]}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["metadata"]["finalizers"] == ["example.com/x"]
    assert resp.json()["apiVersion"] == f"{GROUP}/v1"
    resp = admin_http.patch(
        url,
        data=json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]),
        headers={"Content-Type": "application/json-patch+json"},
    )
    assert resp.status_code == 200, resp.text
    assert not resp.json()["metadata"].get("finalizers")


def test_it_answers_415_for_strategic_merge_before_the_verb_limit(worker_api, admin_http, cluster, store):
    resp = admin_http.patch(
        f"{cluster.server}/apis/{GROUP}/v1/nodemodelstores/{store}",
        data=json.dumps({"spec": {"models": []}}),
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert resp.status_code == 415


@pytest.mark.parametrize("cascade", ["background", "foreground", "orphan"])
def test_it_deletes_a_store_with_every_cascade(worker_api, kubectl, worker_kube, cascade, garbage_collector):
    name = f"node-{uuid.uuid4().hex[:8]}"
    make_store(worker_kube, name)
    kubectl("delete", "nms", name, f"--cascade={cascade}", "--timeout=30s")  # fails if not gone in time
    assert kubectl("get", "nms", name, check=False).returncode != 0


def test_it_collects_a_store_whose_node_is_deleted(worker_api, kubectl, core, worker_kube, garbage_collector):
    from kubernetes import client as k8s

    name = f"node-{uuid.uuid4().hex[:8]}"
    node = core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name)))
    make_store(worker_kube, name, owner={"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid})
    kubectl("delete", "node", name, "--timeout=30s")

    def gone():
        return kubectl("get", "nms", name, check=False).returncode != 0

    wait_for(gone, timeout=60, message="the garbage collector to delete the node's store")
