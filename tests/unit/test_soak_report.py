"""The soak's reading of memory over time: a line fitted after the warm-up, and its two halves, which tell
memory settling (growth slowing towards zero) from a leak (growth holding)."""

import math

import pytest

from tests.soak.load import Series
from tests.soak.report import halves, leak_verdict, memory_rows


def series(rss_at) -> Series:
    """Samples every 10 s for 20 minutes, resident MB given by ``rss_at(minutes)``."""
    seconds = [10.0 * i for i in range(121)]
    return Series(
        seconds=seconds,
        rss_mb=[rss_at(s / 60) for s in seconds],
        fds=[10] * len(seconds),
        threads=[4] * len(seconds),
    )


def wobble(minutes: float) -> float:
    """Noise of ± 0.5 MB that no line follows."""
    return 0.5 * math.sin(minutes * 7.3)


def test_a_steady_leak_grows_in_both_halves():
    s = series(lambda m: 400 + 0.5 * m + wobble(m))
    slope, error = s.slope()
    assert slope == pytest.approx(0.5, abs=0.02)
    assert leak_verdict(s, slope, error) == "GROWS"
    earlier, later = halves(s)
    assert earlier == pytest.approx(0.5, abs=0.05) and later == pytest.approx(0.5, abs=0.05)


def test_memory_settling_slows_to_nothing_in_the_second_half():
    s = series(lambda m: 400 + 10 * (1 - math.exp(-m / 3)))
    earlier, later = halves(s)
    assert earlier > 0.1
    assert later < earlier / 10
    assert later == pytest.approx(0.0, abs=0.02)


def test_noise_alone_is_flat():
    s = series(lambda m: 400 + wobble(m))
    slope, error = s.slope()
    assert leak_verdict(s, slope, error) == "flat"


def test_the_fit_leaves_out_the_warm_up_and_what_comes_after_until():
    """A step in the first fifth is not in the slope; a window ending before a late step does not see it."""
    s = series(lambda m: 300 if m < 3 else (400 if m < 16 else 420))
    assert s.slope()[0] > 0
    assert s.slope(0.2, 0.75)[0] == pytest.approx(0.0, abs=1e-9)


def test_each_roles_row_ends_with_its_halves():
    rows = memory_rows({"api": series(lambda m: 400 + 0.5 * m), "beat": series(lambda m: 120 + wobble(m))})
    api, beat = rows[1].split(), rows[2].split()
    assert api[0] == "api" and api[-2:] == ["+0.50", "+0.50"] and "GROWS" in api
    assert beat[0] == "beat" and "flat" in beat
