"""Merge patches, and what a PATCH of a v1 NodeModelStore may change."""

import pytest

from gpustack_models.api.patches import garbage_collector_patch, merge_patch, patched
from gpustack_models.kube.errors import Invalid, MethodNotAllowed

STORE = {
    "apiVersion": "worker.gpustack.ai/v1alpha1",
    "kind": "NodeModelStore",
    "metadata": {"name": "n1", "resourceVersion": "42", "finalizers": ["a"], "generation": 3},
    "spec": {"models": [{"digest": "sha256:" + "0" * 64}]},
}


@pytest.mark.parametrize(
    "target, patch, result",
    [  # RFC 7386 appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_it_merges_as_rfc_7386_says(target, patch, result):
    assert merge_patch(target, patch) == result


def test_it_lets_the_garbage_collector_change_finalizers_and_owners_only():
    guarded = garbage_collector_patch(STORE, "merge", {"metadata": {"finalizers": None}})
    assert guarded == {"metadata": {"resourceVersion": "42", "finalizers": None, "ownerReferences": None}}
    owner = {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"}
    ops = [{"op": "add", "path": "/metadata/ownerReferences", "value": [owner]}]
    assert garbage_collector_patch(STORE, "json", ops)["metadata"]["ownerReferences"] == [owner]
    assert STORE["metadata"]["finalizers"] == ["a"]  # the current object is left alone


@pytest.mark.parametrize(
    "patch_type, patch",
    [
        ("merge", {"spec": {"models": []}}),
        ("merge", {"metadata": {"labels": {"x": "y"}}}),
        ("json", [{"op": "replace", "path": "/spec/models", "value": []}]),
        ("apply", {"metadata": {"finalizers": []}}),
    ],
)
def test_it_refuses_any_other_change(patch_type, patch):
    with pytest.raises(MethodNotAllowed):
        garbage_collector_patch(STORE, patch_type, patch)


def test_it_answers_invalid_for_a_patch_that_does_not_apply():
    with pytest.raises(Invalid) as refused:
        patched(STORE, "json", [{"op": "remove", "path": "/metadata/nothing"}])
    assert refused.value.code == 422
