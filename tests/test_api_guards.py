"""Status is the worker's alone: tenants cannot change it through v1, nor through v1alpha1 when the
worker is down and clients fall back to the storage version."""

import json
import subprocess
import time
import uuid

import pytest
from kubernetes import client as k8s

from gpustack_models.kinds import GROUP
from tests.support import kube_update, token_http, wait_for

DIGEST = "sha256:" + "12" * 32
FORGED = "sha256:" + "00" * 32
WRITER_RULES = [
    k8s.V1PolicyRule(
        api_groups=[GROUP],
        resources=["modelartifacts", "modelartifacts/status", "nodemodelstores", "nodemodelstores/status"],
        verbs=["get", "list", "watch", "create", "update", "patch", "delete"],
    ),
]


@pytest.fixture(scope="module")
def writer(worker_api, core, api_client, worker_kube):
    """A namespace where dave has write RBAC on the whole group, an artifact with a resolved status,
    and a NodeModelStore dave may write (ClusterRole)."""
    namespace = f"guard-{uuid.uuid4().hex[:6]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    rbac = k8s.RbacAuthorizationV1Api(api_client)
    rbac.create_cluster_role(
        k8s.V1ClusterRole(metadata=k8s.V1ObjectMeta(name=f"writer-{namespace}"), rules=WRITER_RULES)
    )
    rbac.create_cluster_role_binding(
        k8s.V1ClusterRoleBinding(
            metadata=k8s.V1ObjectMeta(name=f"writer-{namespace}"),
            role_ref=k8s.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=f"writer-{namespace}"
            ),
            subjects=[k8s.RbacV1Subject(kind="User", name="dave", api_group="rbac.authorization.k8s.io")],
        )
    )
    base = f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts"
    worker_kube.create(
        base,
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": "guarded"},
            "spec": {"source": {"huggingFace": {"repository": "org/m"}}},
        },
    )
    resolved = {"revision": "a" * 40, "manifestDigest": DIGEST, "fileCount": 1, "sizeBytes": 10}
    kube_update(
        worker_kube,
        f"{base}/guarded/status",
        lambda obj: dict(obj, status={**(obj.get("status") or {}), "resolved": resolved}),
    )
    store = f"guard-node-{uuid.uuid4().hex[:6]}"
    worker_kube.create(
        f"/apis/{GROUP}/v1alpha1/nodemodelstores",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "NodeModelStore",
            "metadata": {"name": store},
            "spec": {"models": [{"digest": DIGEST}]},
        },
    )
    yield namespace, store
    core.delete_namespace(namespace)
    rbac.delete_cluster_role_binding(f"writer-{namespace}")
    rbac.delete_cluster_role(f"writer-{namespace}")
    worker_kube.delete(f"/apis/{GROUP}/v1alpha1/nodemodelstores/{store}")


def stored_digest(worker_kube, namespace):
    obj = worker_kube.get(f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts/guarded")
    return obj["status"]["resolved"]["manifestDigest"]


def test_it_keeps_status_when_a_tenant_writes_it_through_v1(writer, cluster, worker_kube):
    namespace, _ = writer
    dave = token_http(cluster, cluster.tokens()["dave"])
    url = f"{cluster.server}/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts/guarded"
    wait_for(lambda: dave.get(url).status_code == 200, timeout=15, message="dave's RBAC")

    def forge_by_update():
        # A client's read-modify-write: the worker may write status meanwhile (409), so read again.
        current = dave.get(url).json()
        forged = dict(current, status={"resolved": dict(current["status"]["resolved"], manifestDigest=FORGED)})
        return dave.put(url, json=forged).status_code == 200

    assert wait_for(forge_by_update, timeout=20, message="the update to be accepted")
    merge = dave.patch(
        url,
        data=json.dumps({"status": {"resolved": {"manifestDigest": FORGED}}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert merge.status_code == 200
    apply = dave.patch(
        url + "?fieldManager=dave&force=true",
        data=json.dumps(
            {
                "apiVersion": f"{GROUP}/v1",
                "kind": "ModelArtifact",
                "metadata": {"name": "guarded"},
                "status": {"resolved": {"manifestDigest": FORGED}},
            }
        ),
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    assert apply.status_code == 200, apply.text
    assert stored_digest(worker_kube, namespace) == DIGEST
    assert dave.get(url + "/status").status_code == 404


def test_it_refuses_storage_writes_of_spec_or_status_by_anyone_but_the_worker(writer, cluster, worker_kube):
    """The admission policies, checked on the v1alpha1 endpoints directly (what a client falls back to)."""
    namespace, store = writer
    dave = token_http(cluster, cluster.tokens()["dave"])
    base = f"{cluster.server}/apis/{GROUP}/v1alpha1"
    artifact = f"{base}/namespaces/{namespace}/modelartifacts/guarded"
    merge = {"Content-Type": "application/merge-patch+json"}
    wait_for(lambda: dave.get(artifact).status_code == 200, timeout=15, message="dave's RBAC")
    spec = dave.patch(
        artifact, data=json.dumps({"metadata": {"labels": {"x": "1"}}, "spec": {"allowPatterns": ["*"]}}), headers=merge
    )
    assert spec.status_code in (403, 422), spec.text  # the policy (or the immutable-spec rule) refuses it
    status = dave.patch(
        artifact + "/status", data=json.dumps({"status": {"resolved": {"manifestDigest": FORGED}}}), headers=merge
    )
    assert status.status_code == 403, status.text
    assert "only the gpustack-models service" in status.json()["message"]
    store_spec = dave.patch(f"{base}/nodemodelstores/{store}", data=json.dumps({"spec": {"models": []}}), headers=merge)
    assert store_spec.status_code == 403 and "only the gpustack-models service" in store_spec.json()["message"]
    store_status = dave.patch(
        f"{base}/nodemodelstores/{store}/status",
        data=json.dumps({"status": {"models": [{"digest": DIGEST, "state": "Ready"}]}}),
        headers=merge,
    )
    assert store_status.status_code == 403
    created = dave.post(
        f"{base}/namespaces/{namespace}/modelartifacts",
        json={
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": "x"},
            "spec": {"source": {"huggingFace": {"repository": "org/m"}}},
        },
    )
    assert created.status_code == 403
    # Metadata-only changes and deletes stay open.
    label = dave.patch(artifact, data=json.dumps({"metadata": {"labels": {"team": "a"}}}), headers=merge)
    assert label.status_code == 200, label.text
    assert stored_digest(worker_kube, namespace) == DIGEST


@pytest.mark.disruptive
def test_it_holds_while_the_worker_is_down_and_clients_fall_back(writer, worker_api, cluster, tmp_path, worker_kube):
    namespace, store = writer
    token = cluster.tokens()["dave"]

    def kubectl(*args, check=True):
        cmd = [
            str(cluster.kubectl),
            f"--kubeconfig={cluster.token_kubeconfig}",
            f"--token={token}",
            f"--cache-dir={tmp_path}/cache-{time.monotonic_ns()}",
            *args,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{args}: {proc.stderr}")
        return proc

    worker_api.stop()
    try:
        # kube-apiserver notices within its availability and discovery periods; discovery then lists only
        # the storage version, without the v1 short names (so `mart` stops resolving at all).
        def fell_back():
            out = kubectl("get", "modelartifacts", "guarded", "-n", namespace, "-o", "json", check=False)
            return out.returncode == 0 and json.loads(out.stdout)["apiVersion"] == f"{GROUP}/v1alpha1"

        wait_for(fell_back, timeout=150, interval=5, message="clients to fall back to v1alpha1")
        spec = kubectl(
            "patch",
            "modelartifacts",
            "guarded",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            f'{{"spec":{{"expectedDigest":"{FORGED}"}}}}',
            check=False,
        )
        assert spec.returncode != 0
        status = kubectl(
            "patch",
            "modelartifacts",
            "guarded",
            "-n",
            namespace,
            "--type=merge",
            "--subresource=status",
            "-p",
            f'{{"status":{{"resolved":{{"manifestDigest":"{FORGED}"}}}}}}',
            check=False,
        )
        assert status.returncode != 0 and "only the gpustack-models service" in status.stderr
        nms = kubectl("patch", "nodemodelstores", store, "--type=merge", "-p", '{"spec":{"models":[]}}', check=False)
        assert nms.returncode != 0 and "only the gpustack-models service" in nms.stderr
        assert kubectl("label", "modelartifacts", "guarded", "-n", namespace, "down=yes").returncode == 0
        assert kubectl("get", "nodemodelstores", store).returncode == 0
        assert stored_digest(worker_kube, namespace) == DIGEST
    finally:
        worker_api.start()
        worker_api.launcher.wait_available()
