"""The reference model's pure rules: quotas and the per-node cap."""

from datetime import UTC, datetime, timedelta

from gpustack_models.models import TargetState
from gpustack_models.reconcilers.references import Reference, place

T0 = datetime(2026, 1, 1, tzinfo=UTC)


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
