"""When the artifacts' status.nodes is written: a count changes, or the mean percent crosses a 5 % step."""

import pytest

from gpustack_models.reconcilers.rollup import nodes_changed

BASE = {"ready": 1, "downloading": 1, "failed": 0, "downloadingPercent": 12}


@pytest.mark.parametrize(
    "new, changed",
    [
        (BASE, False),
        (dict(BASE, downloadingPercent=14), False),  # same 5 % step (10-14)
        (dict(BASE, downloadingPercent=10), False),
        (dict(BASE, downloadingPercent=15), True),  # the next step
        (dict(BASE, downloadingPercent=9), True),
        (dict(BASE, failed=1), True),  # a count, whatever the percent
        (dict(BASE, ready=2), True),
        ({"ready": 2, "downloading": 0, "failed": 0}, True),  # the percent goes away
    ],
)
def test_it_writes_on_counts_and_5_percent_steps(new, changed):
    assert nodes_changed(BASE, new) is changed


def test_it_writes_the_first_counts_and_a_percent_that_appears():
    assert nodes_changed({}, {"ready": 0, "downloading": 0, "failed": 0}) is False
    assert nodes_changed({}, {"ready": 1, "downloading": 0, "failed": 0}) is True
    assert nodes_changed({"ready": 0, "downloading": 1, "failed": 0}, {**BASE, "ready": 0}) is True
