"""Sizes and ages as kubectl prints them, and Go durations read."""

import pytest

from gpustack_models.kinds.formatting import human_bytes, human_duration, parse_duration


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
