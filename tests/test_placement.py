"""The placement webhook: Pods mounting a model prefer the nodes holding it, through the real kube-apiserver;
who may ask it, and what hostile callers and bodies get."""

from __future__ import annotations

import base64
import json
import socket
import uuid

import pytest
import requests

from gpustack_models.local import pki
from gpustack_models.local.cluster import free_port
from tests.support.kubernetes import wait_default_service_account
from tests.support.stores import entry, place, put_entries, store
from tests.support.waiting import wait_for

PATH = "/internal/v1/placement"
DRIVER = "model.csi.gpustack.ai"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def model_pod(name: str, artifact: str, **spec) -> dict:
    container = {"name": "c", "image": "localhost/none:1", "volumeMounts": [{"name": "m", "mountPath": "/models/m"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [container],
            "volumes": [
                {
                    "name": "m",
                    "csi": {
                        "driver": "model.csi.gpustack.ai",
                        "readOnly": True,
                        "volumeAttributes": {"artifact": artifact},
                    },
                }
            ],
            **spec,
        },
    }


def review(namespace: str, pod: dict, operation="CREATE") -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": str(uuid.uuid4()), "operation": operation, "namespace": namespace, "object": pod},
    }


def client_cert(cluster, tmp_path, common_name: str, authority=None) -> tuple[str, str]:
    """A client certificate for ``common_name`` from the cluster's client CA (or ``authority``)."""
    ca = authority or pki.KeyPair.load(cluster.pki_dir, "ca")
    return tuple(str(p) for p in pki.issue(ca, common_name, client=True).write(tmp_path, common_name))


def held(worker_kube, namespace, resolved, node):
    """Place the ``resolved`` artifact's digest on ``node`` and make its store report it Ready, as its plugin
    would (a node's report counts only for a digest placed there)."""
    artifact, digest = resolved
    wait_for(lambda: store(worker_kube, node), timeout=30, message=f"the store of {node}")
    place(worker_kube, namespace, artifact, digest, [node])
    put_entries(worker_kube, node, [entry(digest, "Ready", 4096, 4096)])


def terms_of(answer: dict) -> list[dict]:
    response = answer["response"]
    assert response["allowed"] is True
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert [op["op"] for op in ops] == ["add"]
    assert ops[0]["path"] == "/spec/affinity"
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in ops[0]["value"]["nodeAffinity"]
    return ops[0]["value"]["nodeAffinity"][PREFERRED]


@pytest.fixture
def caller(cluster, worker_api, tmp_path):
    """The webhook's caller as kube-apiserver presents itself (the user RBAC lets post to it)."""
    from django.conf import settings

    session = worker_api.session(cert=client_cert(cluster, tmp_path, settings.PLACEMENT_CALLER))
    return lambda body: session.post(f"{worker_api.url}{PATH}", json=body, timeout=10)


def test_a_pod_mounting_a_model_prefers_the_nodes_holding_it(caller, worker_kube, nodes, namespace, resolved):
    name, digest = resolved
    held(worker_kube, namespace, resolved, nodes[1])

    def nodes_preferred():
        resp = caller(review(namespace, model_pod("p", name)))
        assert resp.status_code == 200, resp.text
        terms = terms_of(resp.json())
        return terms or None

    terms = wait_for(nodes_preferred, timeout=30, message="the webhook to prefer the holding node")
    assert terms == [
        {"weight": 1, "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [nodes[1]]}]}}
    ]
    # Another namespace names the same artifact: nothing of this namespace's is preferred.
    other = caller(review(f"{namespace}-x", model_pod("p", name))).json()
    assert "patch" not in other["response"] and other["response"]["allowed"] is True
    # An artifact held nowhere, an update, and a Pod already bound are admitted unchanged.
    for body in (
        review(namespace, model_pod("p", "not-there")),
        review(namespace, model_pod("p", name), operation="UPDATE"),
        review(namespace, model_pod("p", name, nodeName=nodes[0])),
    ):
        answer = caller(body).json()["response"]
        assert answer == {"uid": body["request"]["uid"], "allowed": True}


def test_a_pods_own_affinity_is_kept_and_only_a_preference_is_added(caller, worker_kube, nodes, namespace, resolved):
    name, digest = resolved
    held(worker_kube, namespace, resolved, nodes[0])
    required = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]}
    own = {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}}
    pod = model_pod("p", name, affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required,
                                                           PREFERRED: [own]}})  # fmt: skip

    def ops():
        response = caller(review(namespace, pod)).json()["response"]
        return json.loads(base64.b64decode(response["patch"])) if "patch" in response else None

    patch = wait_for(ops, timeout=30, message="a placement patch")
    assert patch == [
        {
            "op": "add",
            "path": f"/spec/affinity/nodeAffinity/{PREFERRED}/-",
            "value": {
                "weight": 1,
                "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [nodes[0]]}]},
            },  # fmt: skip
        }
    ]


def test_only_the_admission_caller_may_ask(cluster, worker_api, tmp_path, namespace):
    body = review(namespace, model_pod("p", "art"))
    url = f"{worker_api.url}{PATH}"
    anonymous = worker_api.session().post(url, json=body, timeout=10)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["kind"] == "Status"
    tenant = worker_api.session(token=cluster.tokens()["alice"]).post(url, json=body, timeout=10)
    assert tenant.status_code == 403, tenant.text
    assert "cannot post path" in tenant.json()["message"]
    # A certificate of the cluster's client CA for someone else is a user without the right.
    mallory = worker_api.session(cert=client_cert(cluster, tmp_path, "mallory")).post(url, json=body, timeout=10)
    assert mallory.status_code == 403, mallory.text
    # The front proxy's certificate without its headers, and a forged token, are nobody.
    proxy = (str(cluster.pki_path("front-proxy-client.crt")), str(cluster.pki_path("front-proxy-client.key")))
    assert worker_api.session(cert=proxy).post(url, json=body, timeout=10).status_code == 401
    assert worker_api.session(token="forged.token.value").post(url, json=body, timeout=10).status_code == 401
    # A certificate of an authority the cluster does not know is refused at the handshake (with TLS 1.3 the
    # client learns it when the server closes the connection instead of answering).
    stranger = client_cert(cluster, tmp_path, "kube-apiserver-admission", authority=pki.new_ca("stranger-ca"))
    with pytest.raises(requests.exceptions.ConnectionError):
        worker_api.session(cert=stranger).post(url, json=body, timeout=10)


@pytest.mark.parametrize(
    "body, field",
    [
        (b"not json", "JSON"),
        (b"[]", "AdmissionReview"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1"}).encode(), "apiVersion"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {}}).encode(), "uid"),
    ],
)
def test_a_malformed_review_is_a_bad_request(cluster, worker_api, tmp_path, body, field):
    from django.conf import settings

    session = worker_api.session(cert=client_cert(cluster, tmp_path, settings.PLACEMENT_CALLER))
    resp = session.post(f"{worker_api.url}{PATH}", data=body, headers={"Content-Type": "application/json"}, timeout=10)
    assert resp.status_code == 400, resp.text
    assert resp.json()["kind"] == "Status" and field in resp.json()["message"]


def test_hostile_pods_are_admitted_unchanged(caller, namespace):
    hostile = [
        {"kind": "Pod", "spec": {"volumes": "not a list"}},
        {"kind": "Pod", "spec": {"volumes": [None, 3, {"csi": "x"}, {"csi": {"driver": "model.csi.gpustack.ai"}}]}},
        {"kind": "Pod", "spec": {"volumes": [{"csi": {"driver": DRIVER, "volumeAttributes": {"artifact": ["x"]}}}]}},
        {"kind": "Pod", "spec": {"volumes": [{"csi": {"driver": DRIVER, "volumeAttributes": ["artifact"]}}]}},
        {"kind": "Pod", "spec": None},
        "a string",
    ]  # fmt: skip
    for pod in hostile:
        body = review(namespace, pod)
        resp = caller(body)
        assert resp.status_code == 200, resp.text
        assert resp.json()["response"] == {"uid": body["request"]["uid"], "allowed": True}


# --- through kube-apiserver and the real kube-scheduler -------------------------------------------------


def schedulable(launcher, name: str, address: str, labels: dict, cpu: str) -> None:
    """A Ready node with a plugin, and room for Pods (``cpu`` allocatable), as its kubelet would report it."""
    launcher.register_node(name, address, labels)
    set_cpu(launcher, name, cpu)
    # kube-apiserver taints a new Node not-ready (TaintNodesByCondition); a cluster's node lifecycle
    # controller lifts it once the kubelet reports Ready, which is done here for a Node without one.
    node = launcher.admin.get(f"/api/v1/nodes/{name}")
    node["spec"]["taints"] = [t for t in node["spec"].get("taints") or [] if t["key"] != "node.kubernetes.io/not-ready"]
    launcher.admin.json("PUT", f"/api/v1/nodes/{name}", body=node)


def set_cpu(launcher, name: str, cpu: str) -> None:
    node = launcher.admin.get(f"/api/v1/nodes/{name}")
    room = {"cpu": cpu, "memory": "8Gi", "pods": "110"}
    node["status"].update(capacity=room, allocatable=room)
    launcher.admin.json("PUT", f"/api/v1/nodes/{name}/status", body=node)


@pytest.fixture
def three_nodes(launcher, worker_stack):
    """Three otherwise equal Ready nodes only Pods selecting their label go to."""
    group = uuid.uuid4().hex[:6]
    names = [f"place-{group}-{i}" for i in range(3)]
    for i, name in enumerate(names):
        schedulable(launcher, name, f"127.0.1.{10 + i}", {"placement": group}, "4")
    yield group, names
    for name in names:
        launcher.unregister_node(name)


def bound(admin, namespace, name) -> tuple[str, dict]:
    """The node the scheduler bound the Pod to, and the Pod (the scheduler's last word if it does not)."""

    def node():
        pod = admin.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return (pod["spec"]["nodeName"], pod) if pod["spec"].get("nodeName") else None

    try:
        return wait_for(node, timeout=30, message=f"the scheduler to bind {name}")
    except AssertionError:
        pod = admin.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        raise AssertionError(f"{name} not bound: {pod['status'].get('conditions')}") from None


def test_the_scheduler_prefers_the_node_holding_the_model_but_fit_comes_first(
    launcher, worker_api, worker_kube, three_nodes, namespace, resolved, core
):
    admin = launcher.admin
    group, names = three_nodes
    name, digest = resolved
    holder = names[2]  # not the first by name: a tie would not land there by chance of order
    held(worker_kube, namespace, resolved, holder)
    wait_default_service_account(admin, namespace)

    def pod(pod_name, cpu):
        manifest = model_pod(pod_name, name, nodeSelector={"placement": group}, automountServiceAccountToken=False)
        manifest["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
        return manifest

    # Wait until the mirror knows the holder (the webhook reads it), then place a Pod for real.
    def warm():
        return terms_of_pod(
            admin.create(f"/api/v1/namespaces/{namespace}/pods", pod(f"w-{uuid.uuid4().hex[:6]}", "1m"))
        )

    wait_for(warm, timeout=30, message="a Pod with a placement preference")
    admin.create(f"/api/v1/namespaces/{namespace}/pods", pod("near", "100m"))
    node, placed = bound(admin, namespace, "near")
    assert node == holder
    assert terms_of_pod(placed) == [[holder]]
    # The holder has no room for a bigger Pod: it schedules elsewhere (a preference, never a requirement).
    set_cpu(launcher, holder, "1")
    admin.create(f"/api/v1/namespaces/{namespace}/pods", pod("big", "2"))
    node, placed = bound(admin, namespace, "big")
    assert node in names[:2]
    assert terms_of_pod(placed) == [[holder]]


def terms_of_pod(pod: dict) -> list[list[str]] | None:
    """The node lists of the placement preferences on a created Pod (never a required term)."""
    affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity
    terms = affinity.get(PREFERRED) or []
    return [t["preference"]["matchFields"][0]["values"] for t in terms if t["weight"] == 1] or None


WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers (a webhook hung), closed afterwards."""
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(16)
    yield server.getsockname()[1]
    server.close()


def fail_open_count(admin) -> float:
    """How often kube-apiserver failed open on the placement webhook (its own metric)."""
    text = admin.request("GET", "/metrics").data.decode()
    wanted = 'apiserver_admission_webhook_fail_open_count{name="placement.model.csi.gpustack.ai"'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(wanted))


def admitted_failing_open(admin, namespace: str, prefix: str, before: float) -> bool:
    """Create a Pod mounting a model: it must be admitted unchanged; True once kube-apiserver counted a
    fail-open on the placement webhook since ``before``."""
    pod = model_pod("unused", "art", automountServiceAccountToken=False)
    created = admin.create(f"/api/v1/namespaces/{namespace}/pods", dict(pod, metadata={"generateName": prefix}))
    assert created["metadata"]["uid"] and "affinity" not in created["spec"]
    return fail_open_count(admin) > before


def test_pods_are_admitted_while_the_webhook_is_down(launcher, worker_api, namespace, silent_port):
    """The webhook's server gone (connection refused) or hung (no answer within its 2 s): kube-apiserver
    calls it, fails open, and admits the Pod unchanged (failurePolicy Ignore)."""
    from gpustack_models import install

    admin = launcher.admin
    wait_default_service_account(admin, namespace)
    path = f"{WEBHOOKS}/{install.webhooks.NAME}"
    for port, why in ((free_port(), "refused-"), (silent_port, "hung-")):
        before = fail_open_count(admin)
        current = admin.get(path)
        current["webhooks"][0]["clientConfig"]["url"] = f"https://127.0.0.1:{port}{install.webhooks.PATH}"
        admin.json("PUT", path, body=current)
        try:
            wait_for(lambda w=why, b=before: admitted_failing_open(admin, namespace, w, b), timeout=30, interval=0.5,
                     message=f"a Pod admitted past a {why} webhook")  # fmt: skip
        finally:
            launcher.register(worker_api.port)
