"""v1 verb limits and bad input: each a Status with the right code, never a 500."""

import json
import uuid

import pytest

from gpustack_models.kinds import GROUP
from gpustack_models.reconcilers.retries import RETRYABLE
from tests.support import wait_for


@pytest.fixture
def v1(worker_api, cluster, admin_http, namespace):
    base = f"{cluster.server}/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts"
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ModelArtifact",
        "metadata": {"name": "lim"},
        "spec": {"source": {"huggingFace": {"repository": "org/m"}}},
    }
    assert admin_http.post(base, json=body).status_code == 201
    return base


def assert_status(resp, code, reason):
    assert resp.status_code == code, resp.text
    body = resp.json()
    assert body["kind"] == "Status" and body["code"] == code and body["reason"] == reason, body
    return body


def test_it_has_no_status_subresource(v1, admin_http):
    assert_status(admin_http.get(f"{v1}/lim/status"), 404, "NotFound")
    assert_status(admin_http.put(f"{v1}/lim/status", json={}), 404, "NotFound")


def test_it_serves_progress_but_never_watches_it(v1, admin_http):
    progress = admin_http.get(f"{v1}/lim/progress")
    assert progress.status_code == 200
    assert progress.json()["kind"] == "ModelArtifactProgress"
    assert_status(admin_http.get(f"{v1}/lim/progress?watch=1"), 405, "MethodNotAllowed")
    assert_status(admin_http.post(f"{v1}/lim/progress", json={}), 405, "MethodNotAllowed")


def test_it_refuses_a_collection_delete(v1, admin_http):
    assert_status(admin_http.delete(v1), 405, "MethodNotAllowed")
    assert admin_http.get(f"{v1}/lim").status_code == 200


def test_it_answers_415_to_strategic_merge_patch(v1, admin_http):
    resp = admin_http.patch(f"{v1}/lim", data="{}", headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert_status(resp, 415, "UnsupportedMediaType")


def test_it_refuses_malformed_json(v1, admin_http):
    body = assert_status(
        admin_http.post(v1, data=b'{"apiVersion": ', headers={"Content-Type": "application/json"}), 400, "BadRequest"
    )
    assert "could not be decoded" in body["message"]
    assert_status(
        admin_http.patch(f"{v1}/lim", data=b"{nope", headers={"Content-Type": "application/merge-patch+json"}),
        400,
        "BadRequest",
    )
    assert_status(admin_http.post(v1, data=b"[1,2]", headers={"Content-Type": "application/json"}), 400, "BadRequest")


def test_it_refuses_unknown_fields_under_strict_validation(v1, admin_http):
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ModelArtifact",
        "metadata": {"name": "strict"},
        "spec": {"source": {"huggingFace": {"repository": "org/m"}}, "bogus": 1},
    }
    resp = admin_http.post(v1 + "?fieldValidation=Strict", json=body)
    assert resp.status_code in (400, 422), resp.text
    assert resp.json()["kind"] == "Status"
    assert "bogus" in resp.json()["message"]


def test_it_refuses_a_namespace_mismatch_in_the_body(v1, admin_http):
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ModelArtifact",
        "metadata": {"name": "elsewhere", "namespace": f"other-{uuid.uuid4().hex[:4]}"},
        "spec": {"source": {"huggingFace": {"repository": "org/m"}}},
    }
    resp = admin_http.post(v1, json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["kind"] == "Status"


def test_it_refuses_a_wrong_api_version_or_kind(v1, admin_http):
    body = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"name": "v"},
        "spec": {"source": {"huggingFace": {"repository": "org/m"}}},
    }
    assert_status(admin_http.post(v1, json=body), 400, "BadRequest")
    body = dict(body, apiVersion=f"{GROUP}/v1", kind="ModelPrefetch")
    assert_status(admin_http.post(v1, json=body), 400, "BadRequest")


def test_it_answers_406_to_a_protobuf_only_client(v1, admin_http):
    resp = admin_http.get(f"{v1}/lim", headers={"Accept": "application/vnd.kubernetes.protobuf"})
    assert resp.status_code == 406, resp.text
    # Through kube-apiserver the Status may come back re-encoded; straight JSON when asked for JSON.
    listed = admin_http.get(v1, headers={"Accept": "application/vnd.kubernetes.protobuf;q=1,application/json;q=0.5"})
    assert listed.status_code == 200 and listed.json()["kind"] == "ModelArtifactList"


def test_it_refuses_an_invalid_object_with_the_field_at_fault(v1, admin_http):
    body = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ModelArtifact",
        "metadata": {"name": "inv"},
        "spec": {"source": {"huggingFace": {"repository": "org/m"}}, "expectedDigest": "md5:1"},
    }
    status = assert_status(admin_http.post(v1, json=body), 422, "Invalid")
    assert "spec.expectedDigest" in [c["field"] for c in status["details"]["causes"]]


def test_it_refuses_an_unsupported_body_type(v1, admin_http):
    resp = admin_http.post(v1, data=b"x", headers={"Content-Type": "text/plain"})
    assert_status(resp, 415, "UnsupportedMediaType")


def test_it_serves_partial_object_metadata(v1, admin_http):
    accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
    listed = admin_http.get(v1, headers={"Accept": accept})
    assert listed.json()["kind"] == "PartialObjectMetadataList"
    assert listed.json()["items"][0]["kind"] == "PartialObjectMetadata"
    assert "spec" not in listed.json()["items"][0]
    one = admin_http.get(
        f"{v1}/lim", headers={"Accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"}
    )
    assert one.json()["kind"] == "PartialObjectMetadata" and one.json()["metadata"]["name"] == "lim"
    # A collection watched as the garbage collector's metadata informer watches it (client-go's metadata
    # client): each event's object is PartialObjectMetadata, the only kind that client decodes.
    metadata_client = (
        "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,"
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
    )
    version = listed.json()["metadata"]["resourceVersion"]
    with admin_http.get(
        v1, params={"watch": "true", "resourceVersion": "0", "timeoutSeconds": "5"},
        headers={"Accept": metadata_client}, stream=True, timeout=30,
    ) as watched:  # fmt: skip
        assert watched.status_code == 200, watched.text
        event = json.loads(next(watched.iter_lines()))
    assert event["type"] == "ADDED" and event["object"]["kind"] == "PartialObjectMetadata", event
    assert event["object"]["apiVersion"] == "meta.k8s.io/v1" and "spec" not in event["object"], event
    assert int(event["object"]["metadata"]["resourceVersion"]) <= int(version)


def test_it_reads_its_own_writes(v1, admin_http, worker_stack):
    # The worker answers the artifact first: its status write is a write too. Its answer for this
    # generation is final (an unknown repository, tried again only minutes later), so nothing else
    # writes the artifact while the test writes and reads.
    def answered():
        obj = admin_http.get(f"{v1}/lim").json()
        status = obj.get("status") or {}
        resolved = [c for c in status.get("conditions") or [] if c["type"] == "Resolved"]
        final = resolved and resolved[0]["reason"] not in RETRYABLE
        return final and status.get("observedGeneration") == obj["metadata"]["generation"]

    # A deadline against a worker that never answers (it may be starting), not a measure of speed.
    wait_for(answered, timeout=120, interval=0.1, message="the worker's answer to the artifact")
    for i in range(5):
        written = admin_http.patch(
            f"{v1}/lim",
            data=json.dumps({"metadata": {"labels": {"i": str(i)}}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        read = admin_http.get(f"{v1}/lim")
        assert read.json()["metadata"]["resourceVersion"] == written.json()["metadata"]["resourceVersion"]


def test_it_honours_send_initial_events(v1, admin_http):
    resp = admin_http.get(
        v1 + "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        "&allowWatchBookmarks=true&timeoutSeconds=5",
        stream=True,
    )
    assert resp.status_code == 200
    events = []
    for line in resp.iter_lines():
        if line:
            events.append(json.loads(line))
            if events[-1]["type"] == "BOOKMARK":
                break
    resp.close()
    assert events[0]["type"] == "ADDED" and events[0]["object"]["apiVersion"] == f"{GROUP}/v1"
    bookmark = events[-1]
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
