"""The tenant ClusterRoles the service ships (``gpustack-models-tenant-reader`` and ``-editor``), bound as an
administrator binds them (a RoleBinding in the tenant's namespace) and used with the tenants' own tokens
through kube-apiserver: what they allow in that namespace, and what they never allow (another namespace, the
status the service writes, the cluster's node stores, the namespace's Secrets)."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client as k8s

from gpustack_models.install.rbac import TENANT_EDITOR, TENANT_READER
from gpustack_models.kinds import GROUP
from tests.support import token_http, wait_for
from tests.test_api_authz import create_artifact, make_namespace

RBAC = "rbac.authorization.k8s.io"


def bind_cluster_role(api_client, namespace: str, user: str, role: str) -> None:
    k8s.RbacAuthorizationV1Api(api_client).create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name=f"{role}-{user}"),
            role_ref=k8s.V1RoleRef(api_group=RBAC, kind="ClusterRole", name=role),
            subjects=[k8s.RbacV1Subject(kind="User", name=user, api_group=RBAC)],
        ),
    )


@pytest.fixture(scope="module")
def tenant_namespaces(worker_api, core, api_client, worker_kube):
    """``own``, where carol holds the reader role and dave the editor role, and ``other``, where neither holds
    anything; an artifact ``qwen`` in each."""
    own, other = make_namespace(core, "roles-own"), make_namespace(core, "roles-other")
    for namespace in (own, other):
        create_artifact(worker_kube, namespace)
    bind_cluster_role(api_client, own, "carol", TENANT_READER)
    bind_cluster_role(api_client, own, "dave", TENANT_EDITOR)
    yield own, other
    for namespace in (own, other):
        core.delete_namespace(namespace)


def tenant(cluster, user: str):
    session = token_http(cluster, cluster.tokens()[user])
    return lambda method, path, **kw: session.request(method, cluster.server + path, timeout=15, **kw)


def artifacts(namespace: str) -> str:
    return f"/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts"


def new_artifact(name: str) -> dict:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ModelArtifact",
        "metadata": {"name": name},
        "spec": {"source": {"huggingFace": {"repository": "Qwen/Qwen2.5-0.5B"}}},
    }


def refused(response) -> bool:
    return response.status_code == 403 and response.json()["reason"] == "Forbidden"


def test_the_reader_role_reads_artifacts_progress_prefetches_and_events_of_its_namespace_only(
    tenant_namespaces, cluster
):
    own, other = tenant_namespaces
    call = tenant(cluster, "carol")
    # The worker caches authorization answers briefly: the binding is seen once a read succeeds.
    wait_for(lambda: call("GET", artifacts(own)).status_code == 200, timeout=15, message="carol's binding")
    assert call("GET", f"{artifacts(own)}/qwen/progress").json()["kind"] == "ModelArtifactProgress"
    assert call("GET", f"/apis/{GROUP}/v1/namespaces/{own}/modelprefetches").status_code == 200
    assert call("GET", f"/api/v1/namespaces/{own}/events").status_code == 200
    assert refused(call("POST", artifacts(own), json=new_artifact("by-reader")))
    assert refused(call("DELETE", f"{artifacts(own)}/qwen"))
    assert refused(call("GET", artifacts(other)))
    assert refused(call("GET", f"{artifacts(other)}/qwen/progress"))


def test_the_editor_role_creates_changes_and_deletes_in_its_namespace_but_never_status_stores_or_secrets(
    tenant_namespaces, cluster
):
    own, other = tenant_namespaces
    call = tenant(cluster, "dave")
    name = f"by-editor-{uuid.uuid4().hex[:6]}"
    created = wait_for(
        lambda: (r := call("POST", artifacts(own), json=new_artifact(name))).status_code == 201 and r,
        timeout=15,
        message="dave's binding",
    )
    assert created.json()["metadata"]["name"] == name
    merge = {"headers": {"Content-Type": "application/merge-patch+json"}}
    patched = call("PATCH", f"{artifacts(own)}/{name}", json={"metadata": {"labels": {"team": "a"}}}, **merge)
    assert patched.status_code == 200 and patched.json()["metadata"]["labels"]["team"] == "a"
    assert refused(call("PATCH", f"{artifacts(own)}/{name}/status", json={"status": {"phase": "Ready"}}, **merge))
    assert refused(call("POST", artifacts(other), json=new_artifact(name)))
    assert refused(call("GET", f"/apis/{GROUP}/v1/nodemodelstores"))
    assert refused(call("GET", f"/api/v1/namespaces/{own}/secrets"))
    assert call("DELETE", f"{artifacts(own)}/{name}").status_code == 200


def test_nothing_the_service_installs_binds_the_tenant_roles(tenant_namespaces, api_client):
    rbac = k8s.RbacAuthorizationV1Api(api_client)
    own, _ = tenant_namespaces
    bindings = [*rbac.list_cluster_role_binding().items, *rbac.list_role_binding_for_all_namespaces().items]
    tenant_roles = [b for b in bindings if b.role_ref.name in (TENANT_READER, TENANT_EDITOR)]
    # The only bindings of them are this test's own, in its namespace: the roles themselves are installed.
    assert sorted((b.metadata.namespace, b.metadata.name) for b in tenant_roles) == [
        (own, f"{TENANT_EDITOR}-dave"),
        (own, f"{TENANT_READER}-carol"),
    ]
    names = {r.metadata.name for r in rbac.list_cluster_role().items}
    assert {TENANT_READER, TENANT_EDITOR} <= names
