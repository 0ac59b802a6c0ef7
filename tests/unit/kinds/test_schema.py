"""The schema vocabulary: each node renders the structural OpenAPI kube-apiserver takes in a CRD (empty values
left out), CEL rules with their optional parts, the walk over every node, and the shared shapes."""

import re

import pytest

from gpustack_models.kinds.schema import (
    DIGEST_PATTERN,
    DNS_SUBDOMAIN,
    Rule,
    Schema,
    array,
    boolean,
    conditions,
    digest,
    integer,
    label_selector,
    obj,
    object_name,
    string,
    string_map,
    timestamp,
)


def test_a_node_renders_only_what_it_sets():
    assert string().to_openapi() == {"type": "string"}
    assert string("A name.", min_length=1, max_length=8, pattern="^a").to_openapi() == {
        "type": "string",
        "description": "A name.",
        "pattern": "^a",
        "minLength": 1,
        "maxLength": 8,
    }
    # Zero and False are values, not absences.
    assert integer(default=0, minimum=0).to_openapi() == {"type": "integer", "format": "int32", "default": 0,
                                                         "minimum": 0}  # fmt: skip
    assert boolean(default=False).to_openapi() == {"type": "boolean", "default": False}


def test_integers_are_int32_unless_asked_for_int64():
    assert integer().format == "int32" and integer(int64=True).format == "int64"
    assert integer(format="int64").to_openapi()["format"] == "int64"


def test_an_int_or_string_node_has_no_type():
    assert Schema("string", int_or_string=True).to_openapi() == {"x-kubernetes-int-or-string": True}


def test_objects_lists_and_maps_render_their_members():
    node = obj(
        "Outer.",
        required=("name",),
        rules=(Rule("self.a <= self.b", "a must not exceed b"),),
        name=string(),
        tags=array(string(), "Tags.", max_items=4, list_type="set"),
        labels=string_map("Labels."),
        created=timestamp(),
    )
    assert node.to_openapi() == {
        "type": "object",
        "description": "Outer.",
        "properties": {
            "name": {"type": "string"},
            "tags": {
                "type": "array",
                "description": "Tags.",
                "maxItems": 4,
                "items": {"type": "string"},
                "x-kubernetes-list-type": "set",
            },
            "labels": {"type": "object", "description": "Labels.", "additionalProperties": {"type": "string",
                                                                                              "maxLength": 63}},
            "created": {"type": "string", "format": "date-time"},
        },
        "required": ["name"],
        "x-kubernetes-validations": [{"rule": "self.a <= self.b", "message": "a must not exceed b"}],
    }  # fmt: skip


def test_a_rule_names_its_field_and_reason_only_when_given():
    assert Rule("r", "m").to_openapi() == {"rule": "r", "message": "m"}
    assert Rule("r", "m", ".x", "FieldValueForbidden").to_openapi() == {
        "rule": "r",
        "message": "m",
        "fieldPath": ".x",
        "reason": "FieldValueForbidden",
    }
    more = string().with_rules(Rule("a", "1")).with_rules(Rule("b", "2"))
    assert [r["rule"] for r in more.to_openapi()["x-kubernetes-validations"]] == ["a", "b"]


def test_a_list_map_and_unknown_fields_render_their_kubernetes_extensions():
    node = array(obj(key=string()), list_type="map", list_map_keys=("key",))
    assert node.to_openapi()["x-kubernetes-list-map-keys"] == ["key"]
    assert Schema("object", preserve_unknown=True).to_openapi() == {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    assert string(enum=("A", "B")).to_openapi()["enum"] == ["A", "B"]


def test_the_walk_visits_every_node_with_its_path():
    node = obj(spec=obj(models=array(obj(digest=string())), labels=string_map()))
    assert [path for path, _ in node.walk()] == [
        "",
        "spec",
        "spec.models",
        "spec.models[]",
        "spec.models[].digest",
        "spec.labels",
        "spec.labels{}",
    ]


@pytest.mark.parametrize(
    "name, ok",
    [("a", True), ("node-1.zone-a", True), ("0", True), ("A", False), ("-a", False), ("a-", False),
     ("a..b", False), ("a_b", False), ("", False)],
)  # fmt: skip
def test_object_names_are_dns_subdomains(name, ok):
    assert bool(re.search(DNS_SUBDOMAIN, name)) is ok
    assert object_name("x").to_openapi() | {"description": "x"} == {
        "type": "string",
        "description": "x",
        "pattern": DNS_SUBDOMAIN,
        "minLength": 1,
        "maxLength": 253,
    }


@pytest.mark.parametrize(
    "value, ok",
    [("sha256:" + "a" * 64, True), ("sha256:" + "A" * 64, False), ("sha256:" + "a" * 63, False),
     ("sha512:" + "a" * 64, False), ("a" * 64, False)],
)  # fmt: skip
def test_digests_are_sha256_and_64_lowercase_hex_digits(value, ok):
    assert bool(re.search(DIGEST_PATTERN, value)) is ok
    assert digest("d").max_length == len("sha256:" + "a" * 64)


def test_conditions_are_a_list_map_keyed_by_type_with_every_metav1_field():
    node = conditions().to_openapi()
    assert node["x-kubernetes-list-type"] == "map" and node["x-kubernetes-list-map-keys"] == ["type"]
    assert node["maxItems"] == 16
    item = node["items"]
    assert item["required"] == ["type", "status", "lastTransitionTime", "reason", "message"]
    assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert item["properties"]["lastTransitionTime"]["format"] == "date-time"


def test_a_label_selector_takes_labels_and_the_four_operators():
    node = label_selector("Nodes.").to_openapi()
    assert set(node["properties"]) == {"matchLabels", "matchExpressions"}
    requirement = node["properties"]["matchExpressions"]["items"]
    assert requirement["required"] == ["key", "operator"]
    assert requirement["properties"]["operator"]["enum"] == ["In", "NotIn", "Exists", "DoesNotExist"]
