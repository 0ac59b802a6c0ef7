"""ModelPrefetch as its one definition declares it: an artifact and exactly one way of naming nodes, its
retention's defaults and Go durations, its status counts, raw fields and v1 columns. Enforced by
kube-apiserver: tests/test_crds.py."""

import re

import pytest

from gpustack_models.kinds import MODEL_PREFETCH
from gpustack_models.kinds.schema import DNS_SUBDOMAIN

NODES = dict(MODEL_PREFETCH.object_schema().walk())


def at(path: str) -> dict:
    return NODES[path].to_openapi()


def test_it_is_a_namespaced_kind_with_its_short_name():
    kind = MODEL_PREFETCH
    assert (kind.kind, kind.plural, kind.scope, kind.short_names) == (
        "ModelPrefetch",
        "modelprefetches",
        "Namespaced",
        ("mpf",),
    )
    assert set(kind.verbs) == {"create", "delete", "get", "list", "patch", "update", "watch"}
    assert kind.subresources == ()


def test_it_names_an_artifact_and_exactly_one_way_of_choosing_nodes():
    spec = at("spec")
    assert spec["required"] == ["artifactRef"] and at("spec.artifactRef")["required"] == ["name"]
    assert spec["x-kubernetes-validations"] == [
        {
            "rule": "has(self.nodeNames) != has(self.nodeSelector)",
            "message": "exactly one of nodeNames or nodeSelector must be set",
        }
    ]
    names = at("spec.nodeNames")
    assert (names["maxItems"], names["x-kubernetes-list-type"], names["items"]["pattern"]) == (
        1024,
        "set",
        DNS_SUBDOMAIN,
    )
    assert set(at("spec.nodeSelector")["properties"]) == {"matchLabels", "matchExpressions"}


def test_min_ready_and_the_retention_have_defaults():
    assert (at("spec.minReady")["default"], at("spec.minReady")["minimum"]) == (0, 0)
    assert at("spec.retention.pinned")["default"] is False
    assert at("spec.retention.ttlAfterLastUse")["default"] == "24h"


@pytest.mark.parametrize(
    "ttl, ok",
    [("24h", True), ("1h30m", True), ("1.5h", True), ("500ms", True), ("90s", True), ("10µs", True),
     ("1d", False), ("24", False), ("h", False), ("-1h", False), ("", False)],
)  # fmt: skip
def test_the_time_to_live_is_a_go_duration(ttl, ok):
    assert bool(re.search(at("spec.retention.ttlAfterLastUse")["pattern"], ttl)) is ok


def test_the_status_counts_nodes():
    assert set(at("status")["properties"]) == {
        "observedGeneration",
        "desiredNodes",
        "readyNodes",
        "downloadingNodes",
        "lapsedNodes",
        "conditions",
    }


def test_the_storage_crd_prints_the_raw_fields_and_the_v1_columns_render_them():
    assert [(f.name, f.json_path, f.type, f.priority) for f in MODEL_PREFETCH.fields] == [
        ("Artifact", ".spec.artifactRef.name", "string", 0),
        ("Desired", ".status.desiredNodes", "integer", 0),
        ("Ready", ".status.readyNodes", "integer", 0),
        ("Downloading", ".status.downloadingNodes", "integer", 0),
        ("Lapsed", ".status.lapsedNodes", "integer", 0),
        ("Available", '.status.conditions[?(@.type=="Available")].status', "string", 0),
        ("Age", ".metadata.creationTimestamp", "date", 1),
    ]
    assert MODEL_PREFETCH.table_from_fields
    render = {c.name: c.render for c in MODEL_PREFETCH.columns}
    assert [render[name]({}) for name in render] == ["", 0, 0, 0, 0, "Unknown", "<unknown>"]
    cells = {"Artifact": "qwen", "Desired": 3, "Ready": 2, "Downloading": 1, "Lapsed": 1, "Available": "False",
             "Age": "1h"}  # fmt: skip
    assert [render[name](cells) for name in render] == ["qwen", 3, 2, 1, 1, "False", "1h"]
