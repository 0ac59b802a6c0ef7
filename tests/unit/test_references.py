"""The reference model's pure rules: label selectors, Go durations, quotas and the per-node cap."""

from datetime import UTC, datetime, timedelta

import pytest

from gpustack_models.kinds.formatting import parse_duration
from gpustack_models.models import TargetState
from gpustack_models.reconcilers.references import Reference, place
from gpustack_models.reconcilers.selection import selector_matches

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "selector, labels, matches",
    [
        ({"matchLabels": {"tier": "gpu"}}, {"tier": "gpu", "zone": "a"}, True),
        ({"matchLabels": {"tier": "gpu"}}, {"tier": "cpu"}, False),
        ({"matchLabels": {"tier": "gpu"}}, {}, False),
        ({}, {"anything": "x"}, True),  # an empty selector selects every node, as in Kubernetes
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "tpu"]}]}, {"tier": "tpu"}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, {}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]}, {}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]}, {"tier": "cpu"}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": ""}, False),
        (
            {"matchLabels": {"tier": "gpu"}, "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"tier": "gpu", "zone": "b"},
            False,
        ),
    ],
)
def test_label_selectors_match_as_kubernetes_does(selector, labels, matches):
    assert selector_matches(selector, labels) is matches


@pytest.mark.parametrize(
    "text, seconds", [("24h", 86400), ("1h30m", 5400), ("90s", 90), ("1.5s", 1.5), ("500ms", 0.5), ("", None),
                      ("5", None), ("h", None), ("1d", None)],
)  # fmt: skip
def test_go_durations(text, seconds):
    assert parse_duration(text) == seconds


def ref(n, *, ns="a", size=10, pinned=False, mounted=False, age=0, digest=None):
    digest = digest or f"sha256:{n:064x}"
    return Reference(digest, ns, size, T0 + timedelta(seconds=age), pinned, mounted, target_id=n)


def test_the_cap_keeps_pinned_then_mounted_then_the_oldest():
    refs = [ref(i, age=i) for i in range(1, 6)] + [ref(9, pinned=True, age=100), ref(8, mounted=True, age=50)]
    placement = place(refs, {}, {}, cap=4)
    assert list(placement.held) == [ref(9).digest, ref(8).digest, ref(1).digest, ref(2).digest]
    assert placement.held[ref(9).digest] is True
    assert [placement.states[i] for i in (1, 2, 3, 4, 5, 8, 9)] == [TargetState.HELD] * 2 + [
        TargetState.NODE_FULL
    ] * 3 + [TargetState.HELD] * 2


def test_a_digest_wanted_twice_takes_one_place_and_is_pinned_if_either_is():
    shared = "sha256:" + "ab" * 32
    placement = place([ref(1, digest=shared), ref(2, ns="b", digest=shared, pinned=True)], {}, {}, cap=1)
    assert placement.held == {shared: True}
    assert placement.states == {1: TargetState.HELD, 2: TargetState.HELD}


def test_a_namespace_past_its_bytes_per_node_is_refused_and_others_are_not():
    refs = [ref(1, size=60, age=1), ref(2, size=60, age=2), ref(3, ns="b", size=500, age=3)]
    placement = place(refs, {}, {"a": 100, "b": 0})
    assert placement.states == {1: TargetState.HELD, 2: TargetState.QUOTA_EXCEEDED, 3: TargetState.HELD}
    assert set(placement.held) == {ref(1).digest, ref(3).digest}


def test_the_quota_counts_a_digest_once_per_namespace_and_never_limits_mounts():
    shared = "sha256:" + "cd" * 32
    refs = [ref(1, size=80, digest=shared), ref(2, size=80, digest=shared, age=1), ref(3, size=500, mounted=True)]
    placement = place(refs, {}, {"a": 100})
    assert placement.states[2] == TargetState.HELD
    assert placement.states[3] == TargetState.HELD


@pytest.mark.parametrize(
    "value, limit", [("1000", 1000), ("0", 0), ("-5", None), ("lots", None), (None, None)],
)  # fmt: skip
def test_a_namespaces_byte_limit_is_read_from_its_annotation_and_a_bad_one_ignored(value, limit):
    from gpustack_models.informers.mirror import PREFETCH_BYTES_ANNOTATION, _namespace_fields

    annotations = {} if value is None else {PREFETCH_BYTES_ANNOTATION: value}
    obj = {"metadata": {"name": "tenant", "annotations": annotations}}
    assert _namespace_fields(obj) == {"prefetch_bytes_per_node": limit}
