"""The leader election's decision alone: whose a Lease is, judged by this process's observation."""

import pytest

from gpustack_models.kube.leases import EXPIRED, FREE, HELD, OURS, lease_duration, micro_time, verdict

ME = "host_1_aaaa"


def spec(**fields):
    return {"holderIdentity": "other_2_bbbb", "leaseDurationSeconds": 15, **fields}


@pytest.mark.parametrize("record", [None, {}, "garbage", 7, {"holderIdentity": ""}, {"holderIdentity": None}])
def test_a_lease_without_a_holder_is_free(record):
    # A released Lease (holderIdentity "") is taken at once, as client-go takes it.
    assert verdict(record, ME, observed_at=100.0, now=100.0, default_duration=15) == FREE


def test_our_own_lease_is_ours_whatever_its_times():
    assert verdict(spec(holderIdentity=ME), ME, observed_at=0.0, now=10_000.0, default_duration=15) == OURS


def test_someone_elses_lease_is_held_until_it_stayed_unchanged_for_its_duration():
    assert verdict(spec(), ME, observed_at=100.0, now=100.0, default_duration=99) == HELD
    assert verdict(spec(), ME, observed_at=100.0, now=115.0, default_duration=99) == HELD
    assert verdict(spec(), ME, observed_at=100.0, now=115.1, default_duration=99) == EXPIRED


def test_remote_clocks_are_not_trusted():
    """A renewTime long past (a holder whose clock lags) does not expire a record seen changing just now."""
    old = spec(renewTime="2001-01-01T00:00:00.000000Z", acquireTime="2001-01-01T00:00:00.000000Z")
    assert verdict(old, ME, observed_at=500.0, now=501.0, default_duration=15) == HELD


@pytest.mark.parametrize("duration", [None, 0, -5, "15", 1.5, True, [15]])
def test_a_missing_or_nonsensical_duration_falls_back_to_the_default(duration):
    record = spec(leaseDurationSeconds=duration)
    if duration is None:
        del record["leaseDurationSeconds"]
    assert lease_duration(record, 4.0) == 4.0
    assert verdict(record, ME, observed_at=10.0, now=13.9, default_duration=4.0) == HELD
    assert verdict(record, ME, observed_at=10.0, now=14.1, default_duration=4.0) == EXPIRED


def test_a_holder_that_is_not_a_string_is_no_holder():
    assert verdict(spec(holderIdentity=["x"]), ME, observed_at=0.0, now=0.0, default_duration=15) == FREE


def test_micro_time_is_what_kube_apiserver_accepts():
    from datetime import UTC, datetime

    assert micro_time(datetime(2026, 12, 1, 10, 0, 0, 5, tzinfo=UTC)) == "2026-12-01T10:00:00.000005Z"
