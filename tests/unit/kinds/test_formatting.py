"""Sizes and ages as kubectl prints them, times in UTC to the second, a store's capacity figure, and Go durations
read."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpustack_models.kinds.formatting import capacity_text, human_bytes, human_duration, parse_duration, timestamp


@pytest.mark.parametrize(
    "seconds, text",
    [
        (-5, "<invalid>"), (-1, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (125, "2m5s"), (599, "9m59s"),
        (600, "10m"), (10799, "179m"), (10800, "3h"), (10860, "3h1m"), (28799, "7h59m"), (28800, "8h"),
        (172799, "47h"), (172800, "2d"), (176400, "2d1h"), (691199, "7d23h"), (691200, "8d"),
        (63071999, "729d"), (63072000, "2y"), (63331200, "2y3d"), (252287999, "7y364d"), (252288000, "8y"),
    ],
)  # fmt: skip
def test_it_prints_ages_like_kubectl(seconds, text):
    assert human_duration(seconds) == text


@pytest.mark.parametrize(
    "value, text",
    [(None, ""), ("", ""), (0, "0B"), (1023, "1023B"), (1024, "1.0Ki"), (999604126, "953.3Mi"), (2**70, "1024.0Ei")],
)
def test_it_prints_sizes_with_binary_suffixes(value, text):
    assert human_bytes(value) == text


@pytest.mark.parametrize(
    "text, seconds", [("24h", 86400), ("1h30m", 5400), ("90s", 90), ("1.5s", 1.5), ("500ms", 0.5), ("", None),
                      ("5", None), ("h", None), ("1d", None)],
)  # fmt: skip
def test_go_durations(text, seconds):
    assert parse_duration(text) == seconds


NOW = datetime(2026, 12, 4, 21, 53, 50, 400000, tzinfo=UTC)


@pytest.mark.parametrize(
    "value, age, text",
    [
        (datetime(2026, 12, 4, 21, 48, 50, 900000, tzinfo=UTC), False, "2026-12-04T21:48:50Z"),
        (datetime(2026, 12, 4, 21, 48, 50, 900000, tzinfo=UTC), True, "2026-12-04T21:48:50Z (5m ago)"),
        (datetime(2026, 12, 4, 22, 48, 50, tzinfo=timezone(timedelta(hours=1))), True, "2026-12-04T21:48:50Z (5m ago)"),
        (datetime(2026, 12, 4, 21, 48, 50), False, "2026-12-04T21:48:50Z"),  # naive: UTC, as stored
        ("2026-12-04T21:48:50Z", True, "2026-12-04T21:48:50Z (5m ago)"),  # a condition's lastTransitionTime
        (NOW + timedelta(minutes=59, seconds=1), True, "2026-12-04T22:52:51Z (in 59m)"),  # a retry time ahead
        (None, True, ""), ("", True, ""), ("not a time", False, ""),
    ],
)  # fmt: skip
def test_it_prints_times_in_utc_to_the_second(value, age, text):
    assert timestamp(value, now=NOW, age=age) == text


def test_it_prints_one_capacity_figure():
    """The volume's used percent and size (what the watermarks and CapacityLow use), then the cache's bytes."""
    assert capacity_text(252 * 2**30, 24 * 2**20, 8) == "8% of 252.0Gi used (the model cache holds 24.0Mi)"
    assert capacity_text(2**40, 961, 0) == "0% of 1.0Ti used (the model cache holds 961B)"
    assert capacity_text(0, 0, 0) == "no capacity reported yet"
