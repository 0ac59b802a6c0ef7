"""The model volumes' checks, their pure parts: the admission policy's shape (its rules and texts come from
``kube.volumes``, the driver's definition), the warnings webhook's route and registration, and how it words an
unresolved artifact. The policy in kube-apiserver and the webhook against the mirror: tests/test_volume_admission.py."""

import inspect

import pytest
from django.test import override_settings
from django.urls import resolve

from gpustack_models.install import policy_objects
from gpustack_models.install import volume_checks as install
from gpustack_models.install.webhooks import MOUNTS_A_MODEL
from gpustack_models.kube.volumes import ATTRIBUTES, KUBE_PREFIX, NOT_READ_ONLY, UNKNOWN
from gpustack_models.models import Artifact, SourceKind
from gpustack_models.webhooks.volume_warnings import VolumeWarningsView, named_artifacts, not_resolved, problem
from tests.unit.kube.test_volumes import model_volume
from tests.unit.urlconfs import for_role

DIGEST = "sha256:" + "a" * 64


def test_the_policy_refuses_pod_creates_mounting_a_model_and_fails_open_on_its_own_errors():
    spec = install.model_volumes_policy()["spec"]
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    assert spec["matchConditions"] == [{"name": "mounts-a-model", "expression": MOUNTS_A_MODEL}]
    assert spec["failurePolicy"] == "Ignore"
    [validation] = spec["validations"]
    assert validation["messageExpression"] == "variables.problems.join('; ')"
    assert validation["reason"] == "Invalid"
    problems = {v["name"]: v["expression"] for v in spec["variables"]}["problems"]
    # The driver's attributes and texts, not copies: each of them appears as a CEL literal.
    assert install.cel_string(KUBE_PREFIX) in problems
    assert "[" + ", ".join(install.cel_string(a) for a in ATTRIBUTES) + "]" in problems
    assert install.cel_format(NOT_READ_ONLY, path="P") == "P + '.readOnly: must be true for model volumes'"
    unknown = install.cel_format(UNKNOWN, path="P", key="k")
    assert unknown.startswith("P + '.volumeAttributes: unknown attribute \"' + k")
    names = [(o["kind"], o["metadata"]["name"]) for o in policy_objects()]
    assert ("ValidatingAdmissionPolicyBinding", install.POLICY) in names


def test_a_cel_literal_escapes_quotes_and_backslashes():
    assert install.cel_string("Pod's \\.") == "'Pod\\'s \\\\.'"


def test_the_warnings_webhook_is_the_api_path_its_caller_may_post_to():
    [webhook] = install.volume_warnings_webhook()["webhooks"]
    assert webhook["clientConfig"]["service"]["path"] == install.PATH
    assert (webhook["failurePolicy"], webhook["timeoutSeconds"], webhook["sideEffects"]) == ("Ignore", 2, "None")
    assert webhook["matchConditions"] == [{"name": "mounts-a-model", "expression": MOUNTS_A_MODEL}]
    assert install.volume_caller_objects()[0]["rules"] == [{"nonResourceURLs": [install.PATH], "verbs": ["post"]}]
    match = resolve(install.PATH, urlconf=for_role("api"))
    assert match.func.view_class is VolumeWarningsView
    assert inspect.iscoroutinefunction(match.func) and match.func.csrf_exempt


def test_the_view_has_no_open_mode():
    with override_settings(PLACEMENT_MODE="nodeLabels"):
        view = VolumeWarningsView()
        assert view.get_authenticators() and view.get_permissions()


def test_a_malformed_pod_names_no_artifact_to_warn_about():
    pod = {"spec": {"volumes": [model_volume("a", artifact="qwen"), {"name": "c", "emptyDir": {}},
                                model_volume("b", artifact="llama")]}}  # fmt: skip
    pod["spec"]["volumes"][2]["csi"]["volumeAttributes"]["expectedDigest"] = DIGEST
    assert named_artifacts(pod) == [("a", "qwen", ""), ("b", "llama", DIGEST)]
    pod["spec"]["volumes"][2]["csi"]["readOnly"] = False
    assert named_artifacts(pod) == []


@pytest.mark.parametrize(
    "reason, body, says",
    [
        ("", {}, "is not resolved yet"),
        ("RepositoryNotFound", {}, "is not resolved yet (RepositoryNotFound)"),
        (
            "RepositoryNotFound",
            {"status": {"conditions": [{"type": "Resolved", "message": "no such\nrepository"}]}},
            "is not resolved yet (RepositoryNotFound: no such repository)",
        ),
        ("", {"status": {"conditions": [{"type": "Resolved", "reason": "R", "message": "m" * 500}]}}, None),
    ],
)
def test_an_unresolved_artifact_is_worded_with_its_condition(reason, body, says):
    text = not_resolved(Artifact(resolved_reason=reason, body=body))
    if says:
        assert text == says
    else:
        assert text.startswith("is not resolved yet (R: mmm") and text.endswith("...)") and len(text) < 150


def test_each_refusal_the_mount_would_meet_is_a_warning_and_a_mountable_artifact_none():
    resolved = dict(resolved_status="True", digest=DIGEST, body={})
    assert problem("team-a", "", None).startswith('does not exist in namespace "team-a"')
    assert problem("team-a", "", Artifact(resolved_status="False", resolved_reason="R")).startswith(
        "is not resolved yet (R); the Pod will wait at mount until it resolves"
    )
    deleting = Artifact(**dict(resolved, body={"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}))
    assert problem("team-a", "", deleting).startswith("is being deleted")
    claim = Artifact(**dict(resolved, source=SourceKind.CLAIM, digest=""))
    assert "mount the claim itself" in problem("team-a", "", claim)
    other = "sha256:" + "b" * 64
    assert problem("team-a", other, Artifact(**resolved)).startswith(f"has digest {DIGEST}, not the volume's")
    assert problem("team-a", DIGEST, Artifact(**resolved)) is None
    assert problem("team-a", "", Artifact(**resolved)) is None
