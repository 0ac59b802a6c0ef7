"""The local control plane is real Kubernetes: version, RBAC, controllers, audit log, restarts."""

import json
import uuid

import pytest
from kubernetes import client as k8s

from gpustack_models.local.cluster import TENANT_GROUP, kube_version
from tests.support import token_http, wait_for


def test_it_reports_the_pinned_server_version(cluster, kubectl):
    out = json.loads(kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == kube_version()
    assert kube_version().startswith("v1.36.")
    assert out["clientVersion"]["gitVersion"] == kube_version()
    # The kubeconfig and kubectl sit where the README says.
    assert cluster.kubeconfig.name == "kubeconfig" and cluster.kubectl.is_symlink()


def test_it_refuses_a_tenant_without_a_binding_and_allows_one_with_it(cluster, namespace, api_client):
    token = cluster.tokens()["alice"]
    tenant = token_http(cluster, token)
    url = f"{cluster.server}/api/v1/namespaces/{namespace}/configmaps"
    denied = tenant.get(url)
    assert denied.status_code == 403
    assert denied.json()["reason"] == "Forbidden"
    assert "alice" in denied.json()["message"]

    rbac = k8s.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(
        namespace,
        k8s.V1Role(
            metadata=k8s.V1ObjectMeta(name="cm-reader"),
            rules=[k8s.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name="alice-cm-reader"),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="cm-reader"),
            subjects=[k8s.RbacV1Subject(kind="User", name="alice", api_group="rbac.authorization.k8s.io")],
        ),
    )
    allowed = wait_for(lambda: tenant.get(url).status_code == 200, message="RBAC to allow alice")
    assert allowed
    # Another tenant is still refused: the binding names alice alone.
    assert token_http(cluster, cluster.tokens()["bob"]).get(url).status_code == 403


def test_it_gives_tenants_their_group(cluster):
    tenant = token_http(cluster, cluster.tokens()["carol"])
    review = tenant.post(
        f"{cluster.server}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert review.status_code == 201, review.text
    user = review.json()["status"]["userInfo"]
    assert user["username"] == "carol"
    assert TENANT_GROUP in user["groups"]


def test_it_completes_namespace_deletion(core):
    name = f"del-{uuid.uuid4().hex[:8]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    core.create_namespaced_config_map(name, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="c"), data={"a": "b"}))
    core.delete_namespace(name)

    def gone():
        try:
            core.read_namespace(name)
            return False
        except k8s.ApiException as exc:
            return exc.status == 404

    wait_for(gone, timeout=60, message="the namespace controller to finish deleting the namespace")


def test_it_collects_a_dependent_when_its_owner_is_deleted(core, namespace):
    owner = core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="owner")))
    core.create_namespaced_config_map(
        namespace,
        k8s.V1ConfigMap(
            metadata=k8s.V1ObjectMeta(
                name="dependent",
                owner_references=[
                    k8s.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
                ],
            )
        ),
    )
    core.delete_namespaced_config_map("owner", namespace)

    def dependent_gone():
        try:
            core.read_namespaced_config_map("dependent", namespace)
            return False
        except k8s.ApiException as exc:
            return exc.status == 404

    wait_for(dependent_gone, timeout=60, message="the garbage collector to delete the dependent")


def test_it_creates_a_pod_in_a_fresh_namespace(core):
    name = f"pod-{uuid.uuid4().hex[:8]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        # The serviceaccount controller gives the namespace its default ServiceAccount.
        wait_for(lambda: _has_default_sa(core, name), timeout=30, message="the default ServiceAccount")
        pod = core.create_namespaced_pod(
            name,
            k8s.V1Pod(
                metadata=k8s.V1ObjectMeta(name="p"),
                spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="example.invalid/none")]),
            ),
        )
        assert pod.spec.service_account_name == "default"
    finally:
        core.delete_namespace(name)


def _has_default_sa(core, namespace):
    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except k8s.ApiException as exc:
        if exc.status == 404:
            return False
        raise


def test_it_records_audited_requests(cluster, admin_http):
    marker = f"audit-{uuid.uuid4().hex[:8]}"  # a user no one grants anything
    resp = admin_http.post(
        f"{cluster.server}/apis/authorization.k8s.io/v1/subjectaccessreviews",
        json={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": marker, "resourceAttributes": {"verb": "get", "resource": "pods"}},
        },
    )
    assert resp.status_code == 201
    assert resp.json()["status"]["allowed"] is False

    audit_id = resp.headers["Audit-Id"]

    def recorded():
        return [e for e in cluster.audit_events() if e["auditID"] == audit_id and e["stage"] == "ResponseComplete"]

    (event,) = wait_for(recorded, timeout=10, message="the SubjectAccessReview in the audit log")
    assert event["level"] == "Request"
    assert event["requestObject"]["spec"]["user"] == marker
    assert event["verb"] == "create"
    assert event["objectRef"]["resource"] == "subjectaccessreviews"
    assert event["user"]["username"] == "kubernetes-admin"
    # Groups outside the audited ones are not logged.
    assert not [e for e in cluster.audit_events() if e.get("objectRef", {}).get("resource") == "configmaps"]


@pytest.mark.disruptive
def test_it_serves_the_same_data_after_kube_apiserver_restarts(cluster, core, namespace):
    core.create_namespaced_config_map(
        namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="survivor"), data={"k": "v"})
    )
    old_pid = cluster.procs["kube-apiserver"].pid
    etcd_pid = cluster.procs["etcd"].pid
    cluster.restart_apiserver()
    assert cluster.procs["kube-apiserver"].pid != old_pid
    assert cluster.procs["etcd"].pid == etcd_pid
    cm = core.read_namespaced_config_map("survivor", namespace)
    assert cm.data == {"k": "v"}


@pytest.mark.parametrize("user", ["alice", "bob"])
def test_it_authenticates_every_tenant_token(cluster, user):
    resp = token_http(cluster, cluster.tokens()[user]).get(f"{cluster.server}/api/v1/namespaces")
    assert resp.status_code == 403  # authenticated (not 401) but not authorized
    assert f'"{user}"' in resp.json()["message"]
