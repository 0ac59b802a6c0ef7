"""What a kind is made of: raw fields as the storage CRD's printer columns, v1 columns as Table definitions,
the kind's derived names and object schema, and the cell renderers the kinds share."""

import pytest

from gpustack_models.kinds import BY_KIND, BY_PLURAL, KINDS, MODEL_ARTIFACT, MODEL_PREFETCH, NODE_MODEL_STORE
from gpustack_models.kinds.base import (
    Column,
    Field,
    ResourceKind,
    age_column,
    artifact_commit,
    artifact_resolved,
    artifact_revision,
    artifact_source,
    count_of,
    store_models,
)
from gpustack_models.kinds.schema import obj, string


def test_a_raw_field_is_a_printer_column_hidden_unless_it_says_otherwise():
    assert Field("Size", ".status.sizeBytes", "integer").to_crd() == {
        "name": "Size",
        "type": "integer",
        "jsonPath": ".status.sizeBytes",
        "description": "Raw .status.sizeBytes for the v1 columns.",
        "priority": 1,
    }
    shown = Field("Ready", ".status.ready", "integer", "Nodes ready.", priority=0).to_crd()
    assert "priority" not in shown and shown["description"] == "Nodes ready."


def test_a_column_is_a_table_column_definition():
    assert Column("Ready", "integer", "Nodes ready.", priority=1).to_table() == {
        "name": "Ready",
        "type": "integer",
        "format": "",
        "description": "Nodes ready.",
        "priority": 1,
    }


def kind(columns, spec_required=True, namespaced=True):
    return ResourceKind(
        kind="Thing",
        plural="things",
        singular="thing",
        namespaced=namespaced,
        description="A thing.",
        spec=obj("Spec.", size=string()),
        status=obj("Status."),
        columns=columns,
        verbs=("get",),
        short_names=(),
        spec_required=spec_required,
    )


def test_a_kind_lists_each_raw_field_once_in_column_order():
    a, b, c = Field("A", ".a"), Field("B", ".b"), Field("C", ".c")
    thing = kind((Column("X", "string", "", fields=(a, b)), Column("Y", "string", "", fields=(b, c))))
    assert thing.fields == (a, b, c)
    assert thing.table_from_fields
    whole = kind((Column("X", "string", "", fields=(a,)), Column("Z", "integer", "", object_render=len)))
    assert not whole.table_from_fields  # one column needs the whole object


def test_a_kind_derives_its_list_kind_scope_and_object_schema():
    thing = kind(())
    assert (thing.list_kind, thing.scope, kind((), namespaced=False).scope) == ("ThingList", "Namespaced", "Cluster")
    schema = thing.object_schema().to_openapi()
    assert list(schema["properties"]) == ["apiVersion", "kind", "metadata", "spec", "status"]
    assert schema["required"] == ["spec"] and schema["description"] == "A thing."
    assert "required" not in kind((), spec_required=False).object_schema().to_openapi()


def test_the_kinds_are_found_by_plural_and_by_kind():
    assert KINDS == (MODEL_ARTIFACT, NODE_MODEL_STORE, MODEL_PREFETCH)
    assert BY_PLURAL["nodemodelstores"] is NODE_MODEL_STORE and BY_KIND["ModelPrefetch"] is MODEL_PREFETCH
    assert all(k.categories == ("gpustack",) for k in KINDS)


@pytest.mark.parametrize(
    "cells, shown",
    [
        ({"HF Repository": "Qwen/Qwen2.5"}, "hf:Qwen/Qwen2.5"),
        ({"MS Repository": "qwen/Qwen2.5"}, "ms:qwen/Qwen2.5"),
        ({"Claim": "models"}, "pvc:models"),
        ({"Claim": "models", "Claim Path": "qwen/7b"}, "pvc:models/qwen/7b"),
        ({}, ""),
    ],
)
def test_an_artifacts_source_is_shown_with_its_kind(cells, shown):
    assert artifact_source(cells) == shown


def test_an_artifacts_revision_stays_the_one_asked_for_and_its_commit_is_beside_it():
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert artifact_revision({"Revision": commit, "HF Revision": "main"}) == "main"  # resolved: still the branch
    assert artifact_commit({"Revision": commit, "HF Revision": "main"}) == commit[:12]
    assert artifact_revision({"MS Revision": "master", "MS Repository": "qwen/q"}) == "master"
    assert artifact_revision({"MS Repository": "qwen/q"}) == "(default)"  # the repository's default branch
    assert artifact_revision({}) == artifact_commit({}) == ""  # a claim


@pytest.mark.parametrize(
    "cells, shown",
    [
        ({}, "Unknown"),
        ({"Resolved": "True", "Resolved Reason": "Resolved"}, "True"),
        ({"Resolved": "False", "Resolved Reason": "AccessDenied"}, "AccessDenied"),
        ({"Resolved": "False"}, "False"),
    ],
)
def test_whether_an_artifact_resolved_shows_the_reason_when_it_did_not(cells, shown):
    assert artifact_resolved(cells) == shown


def test_counts_and_a_stores_models_by_state():
    assert count_of("Ready")({"Ready": 3}) == 3 and count_of("Ready")({"Ready": None}) == 0
    store = {"status": {"models": [{"state": "Ready"}, {"state": "Downloading"}, {"state": "Ready"}]}}
    assert (store_models(store), store_models(store, "Ready"), store_models(store, "Failed")) == (3, 2, 0)
    assert store_models({}) == 0 and store_models({"status": {"models": None}}) == 0


def test_the_age_column_is_shown_by_default_and_unknown_without_a_creation_time():
    age = age_column()
    assert age.priority == 0 and age.fields[0].json_path == ".metadata.creationTimestamp"
    assert age.render({"Age": "5m"}) == "5m" and age.render({}) == "<unknown>"
