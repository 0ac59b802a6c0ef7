"""The node-wide limits on a clock the test moves: the rate limiter's grants, its burst and its changes,
the connection slots and their bound."""

from __future__ import annotations

import pytest

from gpustack_models.plugin.engine.limits import ConnectionSlots, Limits, RateLimiter
from tests.plugin.conftest import KiB, ManualClock, MiB


@pytest.mark.parametrize("rate", [1 * MiB, 256 * KiB])
def test_it_grants_rate_limited_bytes_at_exactly_the_rate(rate):
    clock = ManualClock()
    limiter = RateLimiter(rate, burst_seconds=0.05, clock=clock, sleep=clock.sleep)
    chunk = limiter.chunk(64 * KiB)  # what a reader asks for at once under this rate
    chunks = (4 * MiB) // chunk

    for _ in range(chunks):
        assert limiter.acquire(chunk)

    assert clock.slept > 0
    # Each chunk is granted once the ones before it have had their time at the rate, less the
    # burst allowance: no sooner (faster than the rate) and no later (slower).
    assert clock.now - 1000.0 == pytest.approx((chunks - 1) * chunk / rate - 0.05)


def test_it_grants_at_once_without_a_limit():
    clock = ManualClock()
    limiter = RateLimiter(0, clock=clock, sleep=clock.sleep)
    for _ in range(100):
        assert limiter.acquire(100 * MiB)
    assert (clock.slept, clock.now) == (0, 1000.0)
    assert limiter.chunk(5 * MiB) == 5 * MiB  # unlimited: read what the buffer holds


def test_it_asks_for_a_twentieth_of_a_second_worth_at_a_time():
    limiter = RateLimiter(20 * MiB)
    assert limiter.chunk(4 * MiB) == 1 * MiB
    assert limiter.chunk(64 * KiB) == 64 * KiB  # never more than wanted
    assert RateLimiter(100 * KiB).chunk(4 * MiB) == 16 * KiB  # nor less than the minimum


def test_an_idle_node_builds_no_credit_beyond_the_burst():
    clock = ManualClock()
    limiter = RateLimiter(1 * MiB, burst_seconds=0.05, clock=clock, sleep=clock.sleep)
    clock.now += 3600  # an hour idle

    assert limiter.acquire(100 * KiB)  # a tenth of a second's worth: the burst covers half of it
    assert clock.slept == 0
    assert limiter.acquire(100 * KiB)  # waits for the first one's time at the rate, less the burst
    assert clock.now - 4600.0 == pytest.approx(100 * KiB / MiB - 0.05)


def test_a_new_rate_drops_the_debt_the_old_one_built():
    clock = ManualClock()
    limiter = RateLimiter(64 * KiB, burst_seconds=0, clock=clock, sleep=clock.sleep)
    assert limiter.acquire(640 * KiB)  # ten seconds' worth at the old rate, granted at once (first read)
    limiter.set_rate(1 * MiB)
    assert limiter.bytes_per_second == 1 * MiB

    assert limiter.acquire(1 * MiB)  # not behind the old rate's ten seconds
    assert clock.now == 1000.0
    assert limiter.acquire(1)
    assert clock.now == pytest.approx(1001.0)  # the new rate's second


def test_a_cancelled_reader_stops_waiting():
    clock = ManualClock()
    limiter = RateLimiter(1 * MiB, burst_seconds=0, clock=clock, sleep=clock.sleep)
    assert limiter.acquire(10 * MiB)
    assert not limiter.acquire(1, cancelled=lambda: clock.now > 1002)
    assert clock.now < 1003  # gave up within a step of the cancel, not after the ten seconds


def test_it_holds_at_most_the_limits_connections():
    slots = ConnectionSlots(2)
    assert slots.acquire() and slots.acquire()
    assert slots.in_use == 2 and slots.peak == 2
    assert not slots.acquire(cancelled=lambda: True)  # full: a cancelled caller leaves without a slot
    assert slots.in_use == 2

    slots.release()
    assert slots.acquire(cancelled=lambda: True)  # a free slot is taken, cancelled or not
    slots.set_limit(1)  # lowered: the running ones finish, no new one starts
    slots.release()
    assert not slots.acquire(cancelled=lambda: True)
    slots.release()
    assert slots.acquire() and (slots.in_use, slots.limit, slots.peak) == (1, 1, 2)


def test_the_node_limits_change_together_and_refuse_nonsense():
    clock = ManualClock()
    limits = Limits(4, 0, clock=clock, sleep=clock.sleep)
    limits.set(bytes_per_second=1 * MiB)
    assert (limits.slots.limit, limits.rate.bytes_per_second) == (4, 1 * MiB)
    limits.set(concurrency=2)
    assert (limits.slots.limit, limits.rate.bytes_per_second) == (2, 1 * MiB)
    assert limits.rate.acquire(2 * MiB) and limits.rate.acquire(1)
    assert clock.slept > 0  # the limits' rate runs on the clock given
    with pytest.raises(ValueError, match="concurrency"):
        Limits(0)
    with pytest.raises(ValueError, match="bytes_per_second"):
        limits.set(bytes_per_second=-1)
    assert limits.rate.bytes_per_second == 1 * MiB
