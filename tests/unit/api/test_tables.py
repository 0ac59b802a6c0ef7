"""v1 Tables: from kube-apiserver's Table of the storage CRD (raw cells), and from objects."""

import json

from gpustack_models.api.tables import (
    TableConverter,
    column_definitions,
    include_object_policy,
    object_table_event,
    progress_table,
    table_from_objects,
)
from gpustack_models.kinds import MODEL_ARTIFACT, NODE_MODEL_STORE

DIGEST = "sha256:" + "a" * 64


def crd_table(rows: list[dict], with_columns=True) -> bytes:
    """What kube-apiserver answers for the storage CRD: Name, then one cell per raw field."""
    columns = [{"name": "Name"}] + [{"name": f.name} for f in MODEL_ARTIFACT.fields]
    cells = []
    for row in rows:
        cells.append(
            {
                "cells": [row["Name"]] + [row.get(f.name) for f in MODEL_ARTIFACT.fields],
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"name": row["Name"], "managedFields": [{"apiVersion": "worker.gpustack.ai/v1alpha1"}]},
                },
            }
        )
    return json.dumps({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": "7"},
                       "columnDefinitions": columns if with_columns else None, "rows": cells}).encode()  # fmt: skip


def test_it_turns_raw_cells_into_the_v1_columns():
    raw = crd_table([
        {"Name": "qwen", "HF Repository": "Qwen/Qwen2.5", "HF Revision": "main", "Revision": "0123456789abcdef0123",
         "Size": 1536, "Ready": 3, "Downloading": None, "Resolved": "True", "Age": "5m"},
        {"Name": "pvc", "Claim": "models", "Claim Path": "qwen", "Resolved": "False",
         "Resolved Reason": "ClaimNotFound"},
    ])  # fmt: skip
    table = json.loads(TableConverter(MODEL_ARTIFACT).table(raw))
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Source", "Revision", "Commit", "Size", "Ready", "Downloading", "Resolved", "Age"]
    assert table["rows"][0]["cells"] == [
        "qwen", "hf:Qwen/Qwen2.5", "main", "0123456789ab", "1.5Ki", 3, 0, "True", "5m"
    ]  # fmt: skip
    assert table["rows"][1]["cells"][:4] == ["pvc", "pvc:models/qwen", "", ""]
    assert table["rows"][1]["cells"][7] == "ClaimNotFound"
    assert table["metadata"] == {"resourceVersion": "7"}
    assert table["rows"][0]["object"]["metadata"]["managedFields"][0]["apiVersion"] == "worker.gpustack.ai/v1"


def test_it_sends_column_definitions_on_the_first_watch_event_only():
    converter = TableConverter(MODEL_ARTIFACT)
    first = json.loads(converter.event(b'{"type":"ADDED","object":' + crd_table([{"Name": "a"}]) + b"}", True))
    later = json.loads(
        converter.event(b'{"type":"MODIFIED","object":' + crd_table([{"Name": "a"}], False) + b"}", False)
    )
    assert len(first["object"]["columnDefinitions"]) == len(column_definitions(MODEL_ARTIFACT))
    assert later["object"]["columnDefinitions"] == []
    assert later["object"]["rows"][0]["cells"][0] == "a"
    error = b'{"type":"ERROR","object":{"kind":"Status","code":410}}'
    assert converter.event(error, False) == error


def store(name: str, states: list[str]) -> dict:
    models = [{"digest": DIGEST[:-1] + str(i), "state": s} for i, s in enumerate(states)]
    capacity = {"storedBytes": 3 * 1024**3, "totalBytes": 252 * 1024**3, "usedPercent": 8}
    return {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "NodeModelStore",
            "metadata": {"name": name, "resourceVersion": "9", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {}, "status": {"models": models, "capacity": capacity}}  # fmt: skip


def test_it_renders_counting_columns_from_objects():
    items = [store("n1", ["Ready", "Downloading", "Ready"]), store("n2", [])]
    data = json.dumps({"kind": "NodeModelStoreList", "metadata": {"resourceVersion": "9"}, "items": items}).encode()
    table = json.loads(table_from_objects(NODE_MODEL_STORE, data, is_list=True, include_object="None"))
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Ready", "Cache", "Volume", "Models", "Downloading", "Age"]
    assert table["rows"][0]["cells"][:6] == ["n1", 2, "3.0Gi", "8% of 252.0Gi", 3, 1]
    assert table["rows"][1]["cells"][:6] == ["n2", 0, "3.0Gi", "8% of 252.0Gi", 0, 0]
    assert "object" not in table["rows"][0]


def test_it_includes_the_object_or_its_metadata_as_asked():
    data = json.dumps(store("n1", ["Ready"])).encode()
    whole = json.loads(table_from_objects(NODE_MODEL_STORE, data, is_list=False, include_object="Object"))
    assert whole["rows"][0]["object"]["apiVersion"] == "worker.gpustack.ai/v1"
    assert whole["rows"][0]["object"]["status"]["models"][0]["state"] == "Ready"
    meta = json.loads(table_from_objects(NODE_MODEL_STORE, data, is_list=False, include_object="Metadata"))
    assert meta["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert "status" not in meta["rows"][0]["object"]
    assert include_object_policy({}) == "Metadata"
    assert include_object_policy({"includeObject": "bogus"}) == "Metadata"
    assert include_object_policy({"includeObject": "None"}) == "None"


def test_it_turns_a_bookmark_into_an_empty_table():
    bookmark = b'{"type":"BOOKMARK","object":{"kind":"NodeModelStore","metadata":{"resourceVersion":"12"}}}'
    event = json.loads(object_table_event(NODE_MODEL_STORE, bookmark, "None", with_columns=False))
    assert event["type"] == "BOOKMARK"
    assert event["object"]["rows"] == [] and event["object"]["metadata"] == {"resourceVersion": "12"}


def progress(name="qwen", digest=DIGEST, size=3 * 1024**3, **counts) -> dict:
    """A ``ModelArtifactProgress`` answer as the view computes it (zeros unless given)."""
    return {"kind": "ModelArtifactProgress", "apiVersion": "worker.gpustack.ai/v1",
            "metadata": {"name": name, "namespace": "team-a"}, "timestamp": "2026-01-01T00:00:00Z",
            "manifestDigest": digest, "sizeBytes": size, "ready": 0, "downloading": 0, "failed": 0,
            "downloadingBytes": 0, "live": 0, "failureReasons": []} | counts  # fmt: skip


def test_it_renders_progress_as_one_row_with_wide_columns():
    answer = progress(
        ready=2, downloading=2, failed=3, live=1, downloadingBytes=3 * 1024**3, downloadingPercent=50,
        bytesPerSecond=52_428_800, etaSeconds=125,
        failureReasons=[{"reason": "DiskFull", "count": 1}, {"reason": "SourceUnavailable", "count": 2}],
    )  # fmt: skip
    table = json.loads(progress_table(answer, "None"))
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    columns = [(c["name"], c["priority"]) for c in table["columnDefinitions"]]
    assert columns == [("Name", 0), ("Ready", 0), ("Downloading", 0), ("Failed", 0), ("Percent", 0), ("Bytes", 0),
                       ("Rate", 0), ("ETA", 0), ("Live", 0), ("Digest", 1), ("Failures", 1),
                       ("Reason", 1)]  # fmt: skip
    (row,) = table["rows"]
    assert row["cells"] == ["qwen", 2, 2, 3, "50%", "3.0Gi/6.0Gi", "50.0Mi/s", "2m5s", 1, "sha256:aaaaaaaaaaaa",
                            "DiskFull:1,SourceUnavailable:2", ""]  # fmt: skip
    assert "object" not in row


def test_it_renders_an_unresolved_artifact_as_a_row_of_zeros_with_its_reason():
    for reason in ("NotResolved", "ClaimSource"):
        (row,) = json.loads(progress_table(progress("pvc", "", 0, reason=reason), "None"))["rows"]
        assert row["cells"] == ["pvc", 0, 0, 0, "", "", "", "", 0, "", "", reason]


def test_it_includes_the_progress_or_its_metadata_as_asked():
    answer = progress(ready=1)
    (meta,) = json.loads(progress_table(answer, "Metadata"))["rows"]
    assert meta["object"] == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                              "metadata": {"name": "qwen", "namespace": "team-a"}}  # fmt: skip
    (whole,) = json.loads(progress_table(answer, "Object"))["rows"]
    assert whole["object"] == answer
    assert whole["object"]["kind"] == "ModelArtifactProgress"


def test_it_renders_files_as_a_row_per_file():
    from gpustack_models.api.tables import files_table

    files = [
        {"path": "a/config.json", "sizeBytes": 961, "digest": "gitsha1:" + "1" * 40},
        {"path": "model.safetensors", "sizeBytes": 3 * 1024**3, "digest": "sha256:" + "2" * 64},
    ]
    answer = {"kind": "ModelArtifactFiles", "metadata": {"name": "qwen", "namespace": "team-a"}, "files": files}
    table = json.loads(files_table(answer, "Metadata"))
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [("Path", 0), ("Size", 0), ("Digest", 1)]
    assert [r["cells"] for r in table["rows"]] == [["a/config.json", "961B", "gitsha1:" + "1" * 40],
                                                   ["model.safetensors", "3.0Gi", "sha256:" + "2" * 64]]  # fmt: skip
    assert table["rows"][0]["object"]["metadata"] == answer["metadata"]
    assert json.loads(files_table(dict(answer, files=[]), "None"))["rows"] == []
