"""A Pod's model volumes checked at ``kubectl create``, through the real kube-apiserver: a malformed one is
refused by the admission policy, naming the field (and while the API is down); one naming a ModelArtifact
that does not exist or is not resolved is created with a warning; who may ask the warnings webhook, and what
hostile callers and bodies get."""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from gpustack_models.kinds import GROUP
from gpustack_models.kube.volumes import pod_problems
from gpustack_models.local.cluster import free_port
from tests.support.kubernetes import kubectl_run, wait_default_service_account
from tests.support.waiting import wait_for
from tests.test_placement import client_cert, held, model_pod, review, terms_of_pod

PATH = "/internal/v1/volumes"
STORAGE = f"/apis/{GROUP}/v1alpha1"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def create(cluster, namespace: str, pod: dict, check=False):
    """``kubectl create -f`` of ``pod`` (a fresh name each time): the CompletedProcess."""
    pod = dict(pod, metadata={"name": f"p-{uuid.uuid4().hex[:8]}", "namespace": namespace})
    pod["spec"] = dict(pod["spec"], automountServiceAccountToken=False)
    return kubectl_run(cluster, "create", "-f", "-", "-o", "json", input=yaml.safe_dump(pod), check=check)


def unresolvable(worker_kube, namespace: str, name: str) -> None:
    """A ModelArtifact whose repository the hub does not have: it never resolves."""
    body = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": name},
            "spec": {"source": {"huggingFace": {"repository": f"org/missing-{uuid.uuid4().hex[:6]}"}}}}  # fmt: skip
    worker_kube.create(f"{STORAGE}/namespaces/{namespace}/modelartifacts", body)


@pytest.fixture
def pods_namespace(launcher, namespace):
    wait_default_service_account(launcher.admin, namespace)
    return namespace


def test_a_pod_naming_a_missing_or_unresolved_artifact_is_created_with_a_warning(
    cluster, worker_api, worker_stack, worker_kube, pods_namespace
):
    ns = pods_namespace
    proc = create(cluster, ns, model_pod("p", "not-there"), check=True)
    assert (
        f'Warning: model volume "m": ModelArtifact "not-there" does not exist in namespace "{ns}"; '
        "the Pod will wait at mount until it does"
    ) in proc.stderr
    assert json.loads(proc.stdout)["metadata"]["uid"]
    unresolvable(worker_kube, ns, "pending")

    def warned():
        stderr = create(cluster, ns, model_pod("p", "pending"), check=True).stderr
        return stderr if "is not resolved yet" in stderr else None

    stderr = wait_for(warned, timeout=30, message="a warning that the artifact is not resolved")
    assert 'Warning: model volume "m": ModelArtifact "pending" is not resolved yet' in stderr


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda csi: csi.pop("readOnly"), "spec.volumes[0].csi.readOnly: must be true for model volumes"),
        (lambda csi: csi.update(readOnly=False), "spec.volumes[0].csi.readOnly: must be true for model volumes"),
        (
            lambda csi: csi["volumeAttributes"].update(revision="main"),
            'spec.volumes[0].csi.volumeAttributes: unknown attribute "revision": model volumes take artifact, '
            "expectedDigest",
        ),
    ],
    ids=["readOnly-missing", "readOnly-false", "unknown-attribute"],
)
def test_a_malformed_model_volume_is_refused_naming_the_field(cluster, pods_namespace, change, field):
    pod = model_pod("p", "art")
    change(pod["spec"]["volumes"][0]["csi"])
    proc = create(cluster, pods_namespace, pod)
    assert proc.returncode != 0
    assert field in proc.stderr, proc.stderr
    # The policy's words are the webhooks' (kube.volumes), the same definition.
    assert pod_problems(pod) == [field]


def test_valid_pods_are_placed_and_malformed_ones_refused_while_the_warnings_webhook_is_down(
    cluster, launcher, worker_api, worker_kube, nodes, pods_namespace, resolved
):
    from gpustack_models import install

    ns, (name, _digest) = pods_namespace, resolved
    held(worker_kube, ns, resolved, nodes[0])
    path = f"{VALIDATING}/{install.volume_checks.NAME}"
    current = launcher.admin.get(path)
    current["webhooks"][0]["clientConfig"]["url"] = f"https://127.0.0.1:{free_port()}{PATH}"
    launcher.admin.json("PUT", path, body=current)
    pod = model_pod("p", name)
    pod["spec"]["volumes"].append({"name": "x", "csi": dict(pod["spec"]["volumes"][0]["csi"],
                                                          volumeAttributes={"artifact": "not-there"})})  # fmt: skip
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "x", "mountPath": "/models/x"})
    try:

        def placed():
            proc = create(cluster, ns, pod, check=True)
            assert "Warning" not in proc.stderr, proc.stderr  # the warnings' webhook fails open
            return terms_of_pod(json.loads(proc.stdout))

        assert wait_for(placed, timeout=30, message="a Pod with a placement preference") == [[nodes[0]]]
        malformed = json.loads(json.dumps(pod))
        malformed["spec"]["volumes"][1]["csi"]["readOnly"] = False
        proc = create(cluster, ns, malformed)
        assert proc.returncode != 0 and "spec.volumes[1].csi.readOnly: must be true" in proc.stderr, proc.stderr
    finally:
        launcher.register(worker_api.port)


def test_only_the_admission_caller_learns_whether_an_artifact_exists(
    cluster, worker_stack, worker_api, worker_kube, tmp_path, namespace
):
    from django.conf import settings

    url = f"{worker_api.url}{PATH}"
    unresolvable(worker_kube, namespace, "pending")
    caller = worker_api.session(cert=client_cert(cluster, tmp_path, settings.PLACEMENT_CALLER))

    def warned():
        body = review(namespace, model_pod("p", "pending"))
        answer = caller.post(url, json=body, timeout=10).json()["response"]
        return answer if "is not resolved yet" in " ".join(answer.get("warnings") or ()) else None

    answer = wait_for(warned, timeout=30, message="the artifact in the mirror")
    assert answer["allowed"] is True
    mallory = worker_api.session(cert=client_cert(cluster, tmp_path, "mallory"))
    for session, code in (
        (worker_api.session(), 401),
        (worker_api.session(token="forged.token.value"), 401),
        (worker_api.session(token=cluster.tokens()["alice"]), 403),
        (mallory, 403),
    ):
        answers = []
        for artifact in ("pending", "not-there"):
            body = review(namespace, model_pod("p", artifact))
            body["request"]["uid"] = "same"
            resp = session.post(url, json=body, timeout=10)
            assert resp.status_code == code and resp.json()["kind"] == "Status", resp.text
            answers.append(resp.content)
        assert answers[0] == answers[1], "the answer differs with the artifact's existence"


@pytest.mark.parametrize(
    "body, code, words",
    [
        (b"not json", 400, "could not be decoded"),
        (b"[]", 400, "JSON object"),
        (json.dumps({"kind": "ConfigMap", "apiVersion": "v1"}).encode(), 400, "AdmissionReview"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(), 400, "uid"),
        (b'{"kind": "AdmissionReview", "pad": "' + b"x" * (4 << 20) + b'"}', 413, "larger than"),
    ],
    ids=["not-json", "not-an-object", "wrong-kind", "no-uid", "huge"],
)
def test_a_hostile_body_is_a_status(cluster, worker_api, tmp_path, body, code, words):
    from django.conf import settings

    session = worker_api.session(cert=client_cert(cluster, tmp_path, settings.PLACEMENT_CALLER))
    resp = session.post(f"{worker_api.url}{PATH}", data=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert resp.status_code == code, resp.text
    assert resp.json()["kind"] == "Status" and words in resp.json()["message"], resp.text
