"""Placement where kube-apiserver cannot present a client certificate (``GPUSTACK_PLACEMENT_MODE=nodeLabels``):
the worker labels the Nodes holding an artifact and unlabels them when they no longer do, owning only those
labels; the webhook answers any caller with a function of the request alone (a forged review learns
nothing from the mirror); the real kube-scheduler places a Pod on the labelled node; leaving the mode
removes the labels; the service may change nothing else of a Node."""

from __future__ import annotations

import uuid

import pytest

from gpustack_models import kube
from gpustack_models.kinds.placement_labels import label_key
from gpustack_models.local.cluster import free_port
from tests.support.kubernetes import wait_default_service_account
from tests.support.stores import put_entries
from tests.support.waiting import wait_for
from tests.support.worker import WorkerAPI, WorkerStack, without_session_stack
from tests.test_placement import (
    PATH,
    PREFERRED,
    WEBHOOKS,
    bound,
    held,
    model_pod,
    review,
    schedulable,
    terms_of,
)

FIELD_MANAGER = "gpustack-models-placement-labels"
FOREIGN = "example.com/team"  # a label someone else owns on the same Node


class Mode:
    """The environment of a role in a placement mode (a resync slow enough that reactions do the work)."""

    def __init__(self, mode: str, resync: str = "30"):
        self.extra = {"GPUSTACK_PLACEMENT_MODE": mode, "GPUSTACK_PLACEMENT_LABELS_RESYNC_SECONDS": resync}


class LabelStack(WorkerStack):
    def __init__(self, *args, mode: Mode):
        super().__init__(*args)
        self.mode = mode

    def env(self) -> dict:
        return dict(super().env(), **self.mode.extra)


class LabelAPI(WorkerAPI):
    def env(self) -> dict:
        return dict(super().env(), **Mode("nodeLabels").extra)


@pytest.fixture(scope="module")
def label_writer(launcher):
    """The Node right of the mode (the chart grants it in that mode only)."""
    from gpustack_models import install

    objects = install.label_writer_objects()
    launcher.apply(objects)
    yield
    for obj in objects:
        plural = obj["kind"].lower() + "s"
        launcher.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/{plural}/{obj['metadata']['name']}")


@pytest.fixture(scope="module")
def label_stack(launcher, hub, worker_stack, label_writer):
    """The informers, a Celery worker and beat in the node-labels mode, instead of the session's."""
    stack = LabelStack(launcher, hub, worker_stack.db_url, mode=Mode("nodeLabels"))
    with without_session_stack():
        for name in ("celery", "beat", "informers"):
            stack.start(name)
        try:
            yield stack
        finally:
            for name in ("informers", "beat", "celery"):
                stack.stop(name)


@pytest.fixture(scope="module")
def label_api(launcher, worker_api):
    """An API process in the node-labels mode (the session's stays registered)."""
    api = LabelAPI(launcher, free_port(), worker_api.db_url)
    api.start()
    yield api
    api.stop()


def node_labels(admin, node: str) -> dict:
    return admin.get(f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}


def labelled(admin, node: str, key: str) -> bool:
    return node_labels(admin, node).get(key) == "Ready"


def label_term(namespace: str, artifact: str) -> dict:
    expression = {"key": label_key(namespace, artifact), "operator": "Exists"}
    return {"weight": 1, "preference": {"matchExpressions": [expression]}}


def test_the_worker_labels_the_node_holding_an_artifact_and_unlabels_it(
    launcher, label_stack, worker_kube, nodes, namespace, resolved
):
    admin = launcher.admin
    name, digest = resolved
    key = label_key(namespace, name)
    holder = nodes[1]
    admin.json("PATCH", f"/api/v1/nodes/{holder}", body={"metadata": {"labels": {FOREIGN: "x"}}},
               content_type="application/merge-patch+json")  # fmt: skip
    held(worker_kube, namespace, resolved, holder)
    wait_for(lambda: labelled(admin, holder, key), timeout=30, message="the holder's label")
    assert not any(labelled(admin, node, key) for node in (nodes[0], nodes[2]))
    # The worker's field manager owns exactly the placement labels (and the other label is kept).
    node = admin.get(f"/api/v1/nodes/{holder}")
    (ours,) = [m for m in node["metadata"]["managedFields"] if m["manager"] == FIELD_MANAGER]
    assert ours["fieldsV1"] == {"f:metadata": {"f:labels": {f"f:{key}": {}}}}
    # A label of the prefix the node does not hold, set by someone else, is removed.
    forged = label_key("elsewhere", "forged")
    admin.json("PATCH", f"/api/v1/nodes/{holder}", body={"metadata": {"labels": {forged: "Ready"}}},
               content_type="application/merge-patch+json")  # fmt: skip
    wait_for(lambda: forged not in node_labels(admin, holder), timeout=30, message="the forged label to go")
    assert labelled(admin, holder, key)
    # The node no longer holds it Ready: the label goes, the other label stays.
    put_entries(worker_kube, holder, [])
    wait_for(lambda: key not in node_labels(admin, holder), timeout=30, message="the label to go")
    assert node_labels(admin, holder)[FOREIGN] == "x"
    # Held again, then the artifact is deleted: the label goes with it.
    put_entries(worker_kube, holder, [{"digest": digest, "state": "Ready", "sizeBytes": 4096, "downloadedBytes": 4096}])
    wait_for(lambda: labelled(admin, holder, key), timeout=30, message="the label again")
    worker_kube.delete(f"/apis/worker.gpustack.ai/v1alpha1/namespaces/{namespace}/modelartifacts/{name}")
    wait_for(lambda: key not in node_labels(admin, holder), timeout=30, message="the label to go with the artifact")


def test_an_anonymous_call_gets_the_label_patch_and_nothing_from_the_mirror(
    launcher, label_api, label_stack, worker_api, worker_kube, nodes, namespace, resolved
):
    name, _ = resolved
    anonymous = label_api.session()

    def ask(body):
        resp = anonymous.post(f"{label_api.url}{PATH}", json=body, timeout=10)
        assert resp.status_code == 200, resp.text
        return resp.json()

    body = review(namespace, model_pod("p", name))
    before = ask(body)
    assert terms_of(before) == [label_term(namespace, name)]
    held(worker_kube, namespace, resolved, nodes[0])
    wait_for(lambda: labelled(launcher.admin, nodes[0], label_key(namespace, name)), timeout=30, message="a label")
    # Held or not, the answer is the same: a function of the request.
    assert ask(body) == before
    # Forged reviews for another namespace's artifact, and for one that does not exist, get exactly what
    # the function of their request gives.
    for ns, artifact in ((f"{namespace}-x", name), (namespace, "not-there"), ("kube-system", name)):
        assert terms_of(ask(review(ns, model_pod("p", artifact)))) == [label_term(ns, artifact)]
    # A malformed body is still a 400 Status naming what is wrong.
    resp = anonymous.post(f"{label_api.url}{PATH}", data=b"[]", headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and resp.json()["kind"] == "Status", resp.text
    assert "AdmissionReview" in resp.json()["message"]
    # In the client-certificate mode an anonymous caller is still refused.
    refused = worker_api.session().post(f"{worker_api.url}{PATH}", json=body, timeout=10)
    assert refused.status_code == 401 and refused.json()["kind"] == "Status", refused.text


@pytest.fixture
def labelled_nodes(launcher, label_stack):
    """Three otherwise equal Ready nodes only Pods selecting their label go to."""
    group = uuid.uuid4().hex[:6]
    names = [f"label-{group}-{i}" for i in range(3)]
    for i, name in enumerate(names):
        schedulable(launcher, name, f"127.0.1.{20 + i}", {"placement": group}, "4")
    yield group, names
    for name in names:
        launcher.unregister_node(name)


@pytest.fixture
def webhook_at(launcher, worker_api):
    """Point the placement webhook at another API process; the session's again afterwards."""
    from gpustack_models import install

    path = f"{WEBHOOKS}/{install.webhooks.NAME}"

    def point(api):
        current = launcher.admin.get(path)
        current["webhooks"][0]["clientConfig"]["url"] = f"https://127.0.0.1:{api.port}{PATH}"
        launcher.admin.json("PUT", path, body=current)

    yield point
    launcher.register(worker_api.port)


def test_the_scheduler_places_a_pod_on_the_labelled_node(
    launcher, label_api, webhook_at, worker_kube, labelled_nodes, namespace, resolved
):
    admin = launcher.admin
    group, names = labelled_nodes
    name, _ = resolved
    holder = names[2]  # not the first by name: a tie would not land there by chance of order
    held(worker_kube, namespace, resolved, holder)
    wait_for(lambda: labelled(admin, holder, label_key(namespace, name)), timeout=30, message="the holder's label")
    webhook_at(label_api)
    wait_default_service_account(admin, namespace)

    def pod(pod_name):
        manifest = model_pod(pod_name, name, nodeSelector={"placement": group}, automountServiceAccountToken=False)
        manifest["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m"}}
        return manifest

    def preferred():  # kube-apiserver calls the re-pointed webhook from now on
        created = admin.create(f"/api/v1/namespaces/{namespace}/pods", pod(f"w-{uuid.uuid4().hex[:6]}"))
        return ((created["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(PREFERRED)

    assert wait_for(preferred, timeout=30, message="a Pod with the label preference") == [label_term(namespace, name)]
    admin.create(f"/api/v1/namespaces/{namespace}/pods", pod("near"))
    node, placed = bound(admin, namespace, "near")
    assert node == holder
    assert placed["spec"]["affinity"]["nodeAffinity"][PREFERRED] == [label_term(namespace, name)]


def test_leaving_the_mode_removes_the_labels(launcher, label_stack, worker_kube, nodes, namespace, resolved):
    admin = launcher.admin
    key = label_key(namespace, resolved[0])
    held(worker_kube, namespace, resolved, nodes[2])
    wait_for(lambda: labelled(admin, nodes[2], key), timeout=30, message="the holder's label")
    label_stack.mode = Mode("clientCertificate", resync="1")
    try:
        for name in ("celery", "beat"):
            label_stack.stop(name)
            label_stack.start(name)
        wait_for(lambda: key not in node_labels(admin, nodes[2]), timeout=30, message="the label to be removed")
    finally:
        label_stack.mode = Mode("nodeLabels")
        for name in ("celery", "beat"):
            label_stack.stop(name)
            label_stack.start(name)


def test_the_service_may_change_only_the_placement_labels_of_a_node(launcher, label_writer, worker_kube, nodes):
    node = nodes[0]
    path = f"/api/v1/nodes/{node}"
    own = {"metadata": {"labels": {label_key("ns", "m"): "Ready"}}}
    worker_kube.json("PATCH", path, body=own, content_type="application/merge-patch+json")
    assert labelled(launcher.admin, node, label_key("ns", "m"))
    for patch in (
        {"metadata": {"labels": {FOREIGN: "mine"}}},
        {"metadata": {"labels": {"kubernetes.io/hostname": "elsewhere"}}},
        {"metadata": {"annotations": {"x": "y"}}},
        {"spec": {"unschedulable": True}},
        {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
    ):
        with pytest.raises(kube.Forbidden) as refused:
            worker_kube.json("PATCH", path, body=patch, content_type="application/merge-patch+json")
        assert "may change only the artifacts.worker.gpustack.ai/" in str(refused.value), patch
    assert launcher.admin.get(path)["spec"].get("unschedulable") is not True
