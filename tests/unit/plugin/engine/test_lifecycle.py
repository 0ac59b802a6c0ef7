"""A ``spec.models`` item as the engine reads it: referenced or unreferenced (with its collect time),
pinned, and the items it cannot use."""

from __future__ import annotations

import pytest

from gpustack_models.plugin.engine.lifecycle import Wanted, parse_rfc3339

DIGEST = "sha256:" + "ab" * 32
MOMENT = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@pytest.mark.parametrize(
    "text",
    ["2023-11-14T22:13:20Z", "2023-11-14T22:13:20z", "2023-11-15T00:13:20+02:00", "2023-11-14T22:13:20.000Z"],
)
def test_it_reads_an_rfc3339_time_in_any_zone(text):
    assert parse_rfc3339(text) == MOMENT


@pytest.mark.parametrize(
    "text", ["2023-11-14T22:13:20", "yesterday", "", None, 1_700_000_000, ["2023-11-14T22:13:20Z"]]
)
def test_it_reads_no_time_without_a_zone_or_from_anything_else(text):
    assert parse_rfc3339(text) is None


def test_an_item_without_a_collect_time_is_referenced():
    assert Wanted.from_spec({"digest": DIGEST}) == Wanted(DIGEST, pinned=False, referenced=True, collect_time=None)
    assert Wanted.from_spec({"digest": DIGEST, "pinned": True}).pinned


def test_an_item_with_a_collect_time_is_unreferenced_even_if_the_time_is_unreadable():
    item = Wanted.from_spec({"digest": DIGEST, "collectTime": "2023-11-14T22:13:20Z", "pinned": True})
    assert (item.referenced, item.collect_time, item.pinned) == (False, MOMENT, True)
    garbled = Wanted.from_spec({"digest": DIGEST, "collectTime": "soon"})
    assert (garbled.referenced, garbled.collect_time) == (False, None)


@pytest.mark.parametrize("item", [{}, {"digest": ""}, {"digest": 7}, "sha256:ab", None], ids=str)
def test_it_skips_an_item_without_a_digest(item):
    assert Wanted.from_spec(item) is None


def test_only_true_pins():
    for pinned in ("true", 1, "yes", None):
        assert not Wanted.from_spec({"digest": DIGEST, "pinned": pinned}).pinned
