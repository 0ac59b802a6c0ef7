"""The reference model's pure rules: the ranking, the namespaces' shares of a node and the per-node cap."""

from datetime import UTC, datetime, timedelta

import pytest

from gpustack_models.models import TargetState
from gpustack_models.reconcilers.budgets import Share
from gpustack_models.reconcilers.references import Reference, place, priority

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ref(n, *, ns="a", size=10, pinned=False, mounted=False, age=0, digest=None):
    digest = digest or f"sha256:{n:064x}"
    return Reference(digest, ns, size, T0 + timedelta(seconds=age), pinned, mounted, target_id=n)


def test_the_ranking_puts_mounts_then_pinned_then_the_oldest_and_orders_equals_by_digest():
    young_mount, old_pin = ref(1, mounted=True, age=100), ref(2, pinned=True, age=0)
    oldest, younger, twin = ref(3, age=-50), ref(4, age=10), ref(5, age=10)
    ranked = sorted([twin, younger, oldest, old_pin, young_mount], key=priority)
    assert ranked == [young_mount, old_pin, oldest, younger, twin]


def test_the_cap_keeps_mounted_then_pinned_then_the_oldest():
    refs = [ref(i, age=i) for i in range(1, 6)] + [ref(9, pinned=True, age=0), ref(8, mounted=True, age=50)]
    placement = place(refs, {}, {}, cap=4)
    assert list(placement.held) == [ref(8).digest, ref(9).digest, ref(1).digest, ref(2).digest]
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
    placement = place(refs, {}, {"a": Share(bytes=100), "b": Share()})
    assert placement.states == {1: TargetState.HELD, 2: TargetState.QUOTA_EXCEEDED, 3: TargetState.HELD}
    assert set(placement.held) == {ref(1).digest, ref(3).digest}


def test_the_quota_counts_a_digest_once_per_namespace_and_never_limits_mounts():
    shared = "sha256:" + "cd" * 32
    refs = [ref(1, size=80, digest=shared), ref(2, size=80, digest=shared, age=1), ref(3, size=500, mounted=True)]
    placement = place(refs, {}, {"a": Share(bytes=100)})
    assert placement.states[2] == TargetState.HELD
    assert placement.states[3] == TargetState.HELD


def test_pinned_prefetches_filling_the_cap_never_leave_a_mount_out():
    """The attack: one namespace's pinned prefetches, older than any mount, as many as the cap."""
    pins = [ref(i, ns="attacker", pinned=True, age=-1000 + i) for i in range(1, 5)]
    mount = ref(9, ns="victim", mounted=True, age=100)
    placement = place([*pins, mount], {}, {"attacker": Share()}, cap=4)
    assert mount.digest in placement.held and len(placement.held) == 4
    assert [placement.states[i] for i in range(1, 5)] == [TargetState.HELD] * 3 + [TargetState.NODE_FULL]


def test_mounts_past_the_cap_still_take_every_place_before_a_pin():
    mounts = [ref(i, mounted=True, age=i) for i in range(1, 4)]
    placement = place([ref(9, pinned=True, age=-100), *mounts], {}, {}, cap=2)
    assert list(placement.held) == [ref(1).digest, ref(2).digest]
    assert placement.states[9] == TargetState.NODE_FULL


def test_a_digest_mounted_and_pinned_is_held_pinned():
    shared = "sha256:" + "ef" * 32
    refs = [ref(1, mounted=True, digest=shared), ref(2, ns="b", pinned=True, digest=shared), ref(3, pinned=True)]
    placement = place(refs, {}, {}, cap=1)
    assert placement.held == {shared: True}
    assert placement.states == {1: TargetState.HELD, 2: TargetState.HELD, 3: TargetState.NODE_FULL}


def test_a_namespace_past_its_digests_per_node_is_refused_pinned_first_and_others_are_not():
    refs = [ref(i, age=i) for i in range(1, 4)] + [ref(4, pinned=True, age=99), ref(5, ns="b", age=0)]
    placement = place(refs, {}, {"a": Share(digests=2), "b": Share(digests=2)})
    assert placement.states == {
        1: TargetState.HELD,
        2: TargetState.QUOTA_EXCEEDED,
        3: TargetState.QUOTA_EXCEEDED,
        4: TargetState.HELD,
        5: TargetState.HELD,
    }
    assert set(placement.held) == {ref(1).digest, ref(4).digest, ref(5).digest}


def test_the_digest_limit_counts_a_digest_once_and_never_limits_mounts():
    shared = "sha256:" + "12" * 32
    refs = [ref(1, digest=shared), ref(2, digest=shared, age=1), ref(3, age=2)]
    refs += [ref(i, mounted=True, age=i) for i in range(4, 8)]
    placement = place(refs, {}, {"a": Share(digests=1)})
    assert [placement.states[i] for i in (1, 2, 3)] == [TargetState.HELD] * 2 + [TargetState.QUOTA_EXCEEDED]
    assert len(placement.held) == 5, "one prefetched digest and the four mounts"


@pytest.mark.parametrize(
    "share, admitted",
    [(Share(), 3), (Share(digests=0, bytes=0), 3), (Share(digests=2), 2), (Share(bytes=25, digests=3), 2)],
)
def test_a_share_admits_digests_until_either_limit(share, admitted):
    placement = place([ref(i, age=i) for i in range(1, 4)], {}, {"a": share})
    assert len(placement.held) == admitted
