"""NodeModelStore as its one definition declares it: a cluster-scoped, read-only (to users) store per node,
its spec's limits and defaults, the states, sources and failure reasons of its status, and columns that
count its models from the whole object. Enforced by kube-apiserver: tests/test_crds.py."""

from gpustack_models.kinds import FAILURE_REASONS, MODEL_STATES, NODE_MODEL_STORE
from gpustack_models.kinds.nodemodelstore import (
    MAX_BYTES_PER_SECOND,
    MAX_DOWNLOAD_CONCURRENCY,
    MAX_UPLOAD_CONNECTIONS,
    SOURCE_HUB,
    SOURCE_PEER,
)
from gpustack_models.kinds.schema import DIGEST_PATTERN

NODES = dict(NODE_MODEL_STORE.object_schema().walk())


def at(path: str) -> dict:
    return NODES[path].to_openapi()


def test_it_is_cluster_scoped_users_only_read_or_delete_it_and_its_spec_may_be_absent():
    kind = NODE_MODEL_STORE
    assert (kind.kind, kind.plural, kind.scope, kind.short_names) == (
        "NodeModelStore",
        "nodemodelstores",
        "Cluster",
        ("nms",),
    )
    assert set(kind.verbs) == {"delete", "get", "list", "watch"}
    assert "required" not in at("")


def test_the_watermarks_default_to_80_and_70_and_low_never_exceeds_high():
    watermarks = at("spec.watermarks")
    assert watermarks["default"] == {"highPercent": 80, "lowPercent": 70}
    assert watermarks["x-kubernetes-validations"] == [
        {"rule": "self.lowPercent <= self.highPercent", "message": "lowPercent must not exceed highPercent"}
    ]
    high, low = watermarks["properties"]["highPercent"], watermarks["properties"]["lowPercent"]
    assert (high["minimum"], high["maximum"], low["minimum"], low["maximum"]) == (1, 100, 0, 100)


def test_download_limits_have_defaults_and_upload_limits_leave_the_plugins_own():
    download = at("spec.download")
    assert download["default"] == {"concurrency": 8, "bytesPerSecond": 0}
    assert download["properties"]["concurrency"]["maximum"] == MAX_DOWNLOAD_CONCURRENCY == 256
    upload = at("spec.upload")
    assert "default" not in upload and not any("default" in p for p in upload["properties"].values())
    assert upload["properties"]["connections"]["maximum"] == MAX_UPLOAD_CONNECTIONS == 1024
    assert upload["properties"]["bytesPerSecond"]["format"] == "int64" and MAX_BYTES_PER_SECOND == 2**63 - 1


def test_the_models_asked_for_and_held_are_lists_keyed_by_digest():
    for part in ("spec", "status"):
        models = at(f"{part}.models")
        assert (models["maxItems"], models["x-kubernetes-list-type"], models["x-kubernetes-list-map-keys"]) == (
            256,
            "map",
            ["digest"],
        )
        assert models["items"]["properties"]["digest"]["pattern"] == DIGEST_PATTERN
    assert at("spec.models[]")["required"] == ["digest"] and at("spec.models[].pinned")["default"] is False
    assert at("status.models[]")["required"] == ["digest", "state"]


def test_a_held_model_has_a_state_a_source_and_a_failure_reason_from_the_shared_lists():
    assert MODEL_STATES == ("Downloading", "Ready", "Failed")
    assert at("status.models[].state")["enum"] == list(MODEL_STATES)
    assert at("status.models[].source")["enum"] == [SOURCE_HUB, SOURCE_PEER] == ["Hub", "Peer"]
    reason = at("status.models[].reason")
    assert reason["description"] == "Why it failed: " + ", ".join(FAILURE_REASONS) + "."
    assert reason["enum"] == list(FAILURE_REASONS), "a node's reason must be one of the fixed set"
    assert "InsufficientCapacity" in FAILURE_REASONS and "Canceled" in FAILURE_REASONS


def test_the_columns_count_the_models_from_the_whole_object():
    assert not NODE_MODEL_STORE.table_from_fields
    assert [(f.name, f.json_path) for f in NODE_MODEL_STORE.fields] == [
        ("Stored", ".status.capacity.storedBytes"),
        ("Total", ".status.capacity.totalBytes"),
        ("Used Percent", ".status.capacity.usedPercent"),
        ("Age", ".metadata.creationTimestamp"),
    ]
    store = {
        "status": {
            "capacity": {"storedBytes": 1536 * 1024},
            "models": [{"state": "Ready"}, {"state": "Downloading"}, {"state": "Ready"}, {"state": "Failed"}],
        }
    }
    row = {}
    for column in NODE_MODEL_STORE.columns:
        if column.object_render:
            row[column.name] = column.object_render(store)
        else:
            row[column.name] = column.render(
                {"Stored": 1536 * 1024, "Total": 2 * 1024**3, "Used Percent": 8, "Age": "2d"}
            )
    assert row == {"Ready": 2, "Cache": "1.5Mi", "Volume": "8% of 2.0Gi", "Models": 4, "Downloading": 1, "Age": "2d"}
