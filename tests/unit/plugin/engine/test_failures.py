"""Why a download failed and when it may be tried again: the reasons, the backoff, and the sources that
failed lately."""

from __future__ import annotations

import pytest

from gpustack_models.plugin.engine import backoff_seconds
from gpustack_models.plugin.engine.failures import (
    BACKOFF_INITIAL_SECONDS,
    FALLTHROUGH_REASONS,
    INTEGRITY_MISMATCH,
    REASONS,
    SOURCE_UNAVAILABLE,
    DownloadFailed,
    SourcePenalties,
)
from tests.plugin.conftest import Clock


def test_it_backs_off_from_one_minute_doubling_to_one_hour():
    assert [backoff_seconds(n) for n in range(1, 9)] == [60, 120, 240, 480, 960, 1920, 3600, 3600]
    assert backoff_seconds(1, retry_after=300) == 300
    assert backoff_seconds(1, retry_after=86400) == 3600


def test_it_waits_not_at_all_before_a_failure_and_never_less_than_the_hubs_hint():
    assert backoff_seconds(0) == 0.0
    assert backoff_seconds(-3, retry_after=600) == 0.0
    assert backoff_seconds(3, retry_after=10) == 4 * BACKOFF_INITIAL_SECONDS  # a shorter hint changes nothing
    assert backoff_seconds(2, retry_after=1000) == 1000
    assert backoff_seconds(3, initial=10) == 40
    assert backoff_seconds(10_000) == 3600  # a long run of failures stays capped


def test_it_knows_only_the_nodes_reasons_and_carries_the_hubs_hint():
    with pytest.raises(ValueError, match="unknown failure reason"):
        DownloadFailed("Flaky", "no such reason")
    failure = DownloadFailed(SOURCE_UNAVAILABLE, "HTTP 429", retry_after=30)
    assert (failure.reason, failure.message, failure.retry_after) == (SOURCE_UNAVAILABLE, "HTTP 429", 30)
    assert DownloadFailed(INTEGRITY_MISMATCH, "bad bytes").retry_after is None
    # What one hub refused or failed to serve, another source of the same files may serve; bad bytes are
    # the download's failure whichever source sent them.
    assert set(FALLTHROUGH_REASONS) < set(REASONS)
    assert INTEGRITY_MISMATCH not in FALLTHROUGH_REASONS


def test_it_orders_lately_failed_sources_last_and_forgets_them():
    clock = Clock()
    penalties = SourcePenalties(seconds=300, clock=clock)
    penalties.failed("a")
    clock.advance(10)
    penalties.failed("b")
    assert penalties.order(["a", "b", "c"], key=str) == ["c", "a", "b"]
    penalties.served("b")
    assert penalties.order(["a", "b", "c"], key=str) == ["b", "c", "a"]
    clock.advance(291)
    assert penalties.order(["a", "b", "c"], key=str) == ["a", "b", "c"]
    assert not penalties.penalized("a")


def test_it_counts_a_penalty_from_the_last_failure():
    clock = Clock()
    penalties = SourcePenalties(seconds=300, clock=clock)
    penalties.failed("a")
    clock.advance(200)
    penalties.failed("a")  # failed again: the penalty runs from now
    clock.advance(200)
    assert penalties.penalized("a")
    assert penalties.order(["a", "b"], key=str) == ["b", "a"]
    clock.advance(100)
    assert not penalties.penalized("a")
    assert penalties.order([("a", 1), ("b", 2)], key=lambda s: s[0]) == [("a", 1), ("b", 2)]
