"""v1 <-> v1alpha1: the apiVersion rewrite both ways, and storage errors told at v1."""

import json

from gpustack_models.api.conversion import PUBLIC, STORAGE, public_bytes, public_status, to_storage


def test_it_rewrites_storage_answers_compact_indented_and_escaped():
    last_applied = json.dumps({"apiVersion": STORAGE, "kind": "ModelArtifact"}, separators=(",", ":"))  # as kubectl
    obj = {
        "apiVersion": STORAGE,
        "kind": "ModelArtifact",
        "metadata": {
            "name": "a",
            "managedFields": [{"apiVersion": STORAGE, "manager": "kubectl"}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": last_applied},
        },
    }
    for text in (json.dumps(obj, separators=(",", ":")), json.dumps(obj, indent=2)):
        out = json.loads(public_bytes(text.encode()))
        assert out["apiVersion"] == PUBLIC
        assert out["metadata"]["managedFields"][0]["apiVersion"] == PUBLIC
        annotation = out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        assert json.loads(annotation) == {"apiVersion": PUBLIC, "kind": "ModelArtifact"}
    event = json.dumps({"type": "ADDED", "object": obj}, separators=(",", ":")).encode()
    assert json.loads(public_bytes(event))["object"]["apiVersion"] == PUBLIC


def test_it_leaves_other_text_alone():
    data = json.dumps({"apiVersion": "v1", "kind": "Status", "message": f"label value {STORAGE}"}).encode()
    assert public_bytes(data) == data


def test_it_rewrites_request_bodies_to_the_storage_version():
    body = {
        "apiVersion": PUBLIC,
        "metadata": {
            "ownerReferences": [{"apiVersion": PUBLIC, "kind": "ModelArtifact"}, {"apiVersion": "v1", "kind": "Node"}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": f'{{"apiVersion":"{PUBLIC}"}}'},
        },
    }
    out = to_storage(body)
    assert out["apiVersion"] == STORAGE
    assert [o["apiVersion"] for o in out["metadata"]["ownerReferences"]] == [STORAGE, "v1"]
    assert json.loads(out["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]) == {
        "apiVersion": STORAGE
    }


def test_it_tells_storage_errors_at_v1():
    status = {
        "kind": "Status",
        "code": 400,
        "message": 'ModelArtifact in version "v1alpha1" cannot be handled as a ModelArtifact: strict decoding error',
        "details": {
            "causes": [{"message": f"conflict with kubectl using {STORAGE}: .spec", "field": ".spec"}, "odd"],
        },
    }
    out = public_status(status)
    assert out["message"] == 'ModelArtifact in version "v1" cannot be handled as a ModelArtifact: strict decoding error'
    assert out["details"]["causes"][0]["message"] == f"conflict with kubectl using {PUBLIC}: .spec"
    assert out["details"]["causes"][1] == "odd"
    assert "v1alpha1" not in json.dumps(out)
    assert status["message"].startswith('ModelArtifact in version "v1alpha1"')  # the input is left alone
