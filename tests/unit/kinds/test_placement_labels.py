"""The Node label of an artifact (placement without a client certificate): valid, stable, distinct, and
computed from the namespace and name alone."""

import hashlib

import pytest

from gpustack_models.kinds.placement_labels import (
    LABEL_PREFIX,
    is_placement_label,
    label_key,
    placement_labels,
    valid_label_key,
)


def test_the_key_is_the_prefix_and_the_first_40_hex_of_the_names_hash():
    expected = hashlib.sha256(b"team-a/qwen").hexdigest()[:40]
    assert label_key("team-a", "qwen") == f"artifacts.worker.gpustack.ai/{expected}"
    assert label_key("team-a", "qwen") == label_key("team-a", "qwen")


@pytest.mark.parametrize(
    "namespace, name",
    [("a", "b"), ("t-" + "x" * 61, "m" * 253), ("kube-system", "a.b.c"), ("ns", "UPPER_and.dots-1")],
)
def test_every_key_is_a_valid_label_key(namespace, name):
    key = label_key(namespace, name)
    prefix, name_part = key.split("/")
    assert prefix == LABEL_PREFIX and len(name_part) == 40 and len(key) <= 253 + 1 + 63
    assert valid_label_key(key)


def test_namespace_and_name_are_not_confused():
    # "a/b-c" and "a-b/c" (or a name carrying the separator) are different artifacts, different labels.
    keys = {label_key("a", "b-c"), label_key("a-b", "c"), label_key("ab", "c"), label_key("a", "bc")}
    assert len(keys) == 4


def test_the_validator_refuses_bad_keys():
    for key in ("", "a/", "/x", "UPPER.example/x", "a" * 254 + "/x", "p/" + "x" * 64, "p/-x", "p/x_"):
        assert not valid_label_key(key), key
    assert valid_label_key("x" * 63) and valid_label_key("example.com/x")


def test_only_the_prefix_is_recognised():
    labels = {
        label_key("ns", "m"): "Ready",
        "kubernetes.io/hostname": "n1",
        "artifacts.worker.gpustack.ai.evil/x": "Ready",
        "worker.gpustack.ai/other": "x",
    }
    assert placement_labels(labels) == {label_key("ns", "m"): "Ready"}
    assert is_placement_label(label_key("ns", "m")) and not is_placement_label(None)
    assert placement_labels(None) == {}
