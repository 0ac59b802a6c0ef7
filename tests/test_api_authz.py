"""Delegated authorization, through kube-apiserver and straight to the worker."""

import json
import uuid

import pytest
from kubernetes import client as k8s

from gpustack_models.kinds import GROUP
from tests.support import token_http, wait_for

SEED_ROLE_RULES = [
    k8s.V1PolicyRule(
        api_groups=[GROUP], resources=["modelartifacts", "modelartifacts/progress"], verbs=["get", "list", "watch"]
    )
]


def make_namespace(core, prefix):
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    return name


def bind(api_client, namespace, subject_kind, subject, rules, name="model-artifact-reader"):
    rbac = k8s.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(namespace, k8s.V1Role(metadata=k8s.V1ObjectMeta(name=name), rules=rules))
    rbac.create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name=name),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
            subjects=[k8s.RbacV1Subject(kind=subject_kind, name=subject, api_group="rbac.authorization.k8s.io")],
        ),
    )


def create_artifact(worker_kube, namespace, name="qwen"):
    worker_kube.create(
        f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": name},
            "spec": {"source": {"huggingFace": {"repository": "Qwen/Qwen2.5-0.5B"}}},
        },
    )


@pytest.fixture(scope="module")
def teams(worker_api, core, api_client, worker_kube):
    """team-a where alice has exactly the seed's Role; team-b where she has nothing; team-c where bob may
    only `get modelartifacts`."""
    team_a, team_b, team_c = (make_namespace(core, p) for p in ("team-a", "team-b", "team-c"))
    for ns in (team_a, team_b, team_c):
        create_artifact(worker_kube, ns)
    bind(api_client, team_a, "User", "alice", SEED_ROLE_RULES)
    bind(
        api_client,
        team_c,
        "User",
        "bob",
        [k8s.V1PolicyRule(api_groups=[GROUP], resources=["modelartifacts"], verbs=["get"])],
    )
    yield team_a, team_b, team_c
    for ns in (team_a, team_b, team_c):
        core.delete_namespace(ns)


def paths(namespace):
    base = f"/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts"
    return {"list": base, "get": f"{base}/qwen", "progress": f"{base}/qwen/progress"}


def through_aggregator(cluster, user):
    return token_http(cluster, cluster.tokens()[user]), cluster.server


def direct_token(worker_api, cluster, user):
    return worker_api.session(token=cluster.tokens()[user]), worker_api.url


def direct_front_proxy(worker_api, cluster, user):
    cert = (str(cluster.pki_path("front-proxy-client.crt")), str(cluster.pki_path("front-proxy-client.key")))
    session = worker_api.session(cert=cert, headers={"X-Remote-User": user, "X-Remote-Group": "gpustack:tenants"})
    return session, worker_api.url


CLIENTS = [through_aggregator, direct_token, direct_front_proxy]


def _client(how, worker_api, cluster, user):
    return how(cluster, user) if how is through_aggregator else how(worker_api, cluster, user)


@pytest.mark.parametrize("how", CLIENTS, ids=lambda f: f.__name__)
def test_it_lets_the_seed_role_read_its_namespace_only(how, teams, worker_api, cluster):
    team_a, team_b, _ = teams
    session, base = _client(how, worker_api, cluster, "alice")
    for verb, path in paths(team_a).items():
        resp = wait_for(
            lambda path=path: (r := session.get(base + path)).status_code == 200 and r,
            timeout=15,
            message=f"alice to {verb} in team-a",
        )
        body = resp.json()
        if verb == "progress":
            assert body["kind"] == "ModelArtifactProgress"
        else:
            assert body["apiVersion"] == f"{GROUP}/v1"
    for verb, path in paths(team_b).items():
        resp = session.get(base + path)
        assert resp.status_code == 403, (verb, resp.text)
        assert resp.json()["kind"] == "Status" and resp.json()["reason"] == "Forbidden"


@pytest.mark.parametrize("how", CLIENTS, ids=lambda f: f.__name__)
def test_it_refuses_progress_to_get_modelartifacts_alone(how, teams, worker_api, cluster):
    _, _, team_c = teams
    session, base = _client(how, worker_api, cluster, "bob")
    got = wait_for(
        lambda: session.get(base + paths(team_c)["get"]).status_code == 200,
        timeout=15,
        message="bob to get the artifact",
    )
    assert got
    resp = session.get(base + paths(team_c)["progress"])
    assert resp.status_code == 403
    assert "modelartifacts/progress" in resp.json()["message"]


def test_it_records_its_own_subject_access_review_in_the_audit_log(teams, worker_api, cluster):
    from django.conf import settings

    _, team_b, _ = teams
    # A fresh user, so no cached answer hides the review.
    auditee = f"auditee-{uuid.uuid4().hex[:6]}"
    session = worker_api.session(
        cert=(str(cluster.pki_path("front-proxy-client.crt")), str(cluster.pki_path("front-proxy-client.key"))),
        headers={"X-Remote-User": auditee},
    )
    assert session.get(worker_api.url + paths(team_b)["list"]).status_code == 403
    worker = f"system:serviceaccount:{settings.NAMESPACE}:{settings.SERVICE_ACCOUNT}"

    def reviewed():
        return [
            e
            for e in cluster.audit_events()
            if e.get("objectRef", {}).get("resource") == "subjectaccessreviews"
            and e["stage"] == "ResponseComplete"
            and (e.get("requestObject") or {}).get("spec", {}).get("user") == auditee
        ]

    (event,) = wait_for(reviewed, timeout=10, message="the worker's SubjectAccessReview of the caller in the audit log")
    assert event["user"]["username"] == worker
    attributes = event["requestObject"]["spec"]["resourceAttributes"]
    assert (attributes["verb"], attributes["resource"], attributes["namespace"]) == ("list", "modelartifacts", team_b)
    assert "system:authenticated" in event["requestObject"]["spec"]["groups"]


def test_it_passes_a_group_with_a_comma_as_one_group(worker_api, kubectl, core, api_client, worker_kube):
    namespace = make_namespace(core, "comma")
    try:
        create_artifact(worker_kube, namespace)
        bind(api_client, namespace, "Group", "a,b", SEED_ROLE_RULES)
        # Through kube-apiserver's impersonation: the front proxy sends "a,b" as one header line; the
        # worker's own SubjectAccessReview must carry it as one group or it would be refused here.
        out = wait_for(
            lambda: (
                (
                    p := kubectl(
                        "get", "mart", "qwen", "-n", namespace, "-o", "json", "--as=u", "--as-group=a,b", check=False
                    )
                ).returncode
                == 0
                and p
            ),
            timeout=15,
            message="the group a,b to be allowed",
        )
        assert json.loads(out.stdout)["metadata"]["name"] == "qwen"
        split = kubectl("get", "mart", "qwen", "-n", namespace, "--as=u", "--as-group=a", "--as-group=b", check=False)
        assert split.returncode != 0 and "forbidden" in split.stderr.lower()
    finally:
        core.delete_namespace(namespace)


def test_it_refuses_to_create_an_artifact_naming_a_secret_the_creator_cannot_read(
    worker_api, core, api_client, cluster
):
    namespace = make_namespace(core, "secret")
    try:
        core.create_namespaced_secret(
            namespace, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="hf-token"), string_data={"token": "hf_x"})
        )
        bind(
            api_client,
            namespace,
            "User",
            "carol",
            [k8s.V1PolicyRule(api_groups=[GROUP], resources=["modelartifacts"], verbs=["create", "get"])],
            name="creator",
        )
        session = token_http(cluster, cluster.tokens()["carol"])
        url = f"{cluster.server}/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts"

        def body(name):
            return {
                "apiVersion": f"{GROUP}/v1",
                "kind": "ModelArtifact",
                "metadata": {"name": name},
                "spec": {"source": {"huggingFace": {"repository": "org/private", "secretRef": {"name": "hf-token"}}}},
            }

        plain = {
            "apiVersion": f"{GROUP}/v1",
            "kind": "ModelArtifact",
            "metadata": {"name": "plain"},
            "spec": {"source": {"huggingFace": {"repository": "org/public"}}},
        }
        wait_for(
            lambda: session.post(url, json=plain).status_code == 201,
            timeout=15,
            message="carol's create permission to take effect",
        )
        refused = session.post(url, json=body("a"))
        assert refused.status_code == 403, refused.text
        assert 'cannot get resource "secrets"' in refused.json()["message"]
        assert refused.json()["details"]["causes"][0]["field"] == "spec.source.huggingFace.secretRef.name"
        # A registry's pull Secret is read the same way: naming one takes the right to read it.
        oci = dict(
            body("c"), spec={"source": {"oci": {"reference": "r.example/m:v1", "secretRef": {"name": "hf-token"}}}}
        )
        refused = session.post(url, json=oci)
        assert refused.status_code == 403, refused.text
        assert refused.json()["details"]["causes"][0]["field"] == "spec.source.oci.secretRef.name"
        bind(
            api_client,
            namespace,
            "User",
            "carol",
            [k8s.V1PolicyRule(api_groups=[""], resources=["secrets"], resource_names=["hf-token"], verbs=["get"])],
            name="secret-reader",
        )
        allowed = wait_for(
            lambda: (r := session.post(url, json=body("b"))).status_code == 201 and r,
            timeout=20,
            message="the create to be allowed once carol can read the Secret",
        )
        assert allowed.json()["spec"]["source"]["huggingFace"]["secretRef"] == {"name": "hf-token"}
    finally:
        core.delete_namespace(namespace)
