"""The suite's plugins: fixtures live in ``tests.support`` (helpers importable from there too)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from tests.support import lanes

pytest_plugins = [
    "tests.support.cluster",
    "tests.support.worker",
    "tests.support.plugins",
    "tests.support.plugin_scenario",
    "tests.support.stores",
    "tests.support.mounts",
    "tests.support.kubelet",
    "tests.support.image_build",
    "tests.support.helm",
    "tests.support.release",
    "tests.support.registry",
    "tests.support.s3server",
    "tests.fakehub.fixtures",
]


@pytest.hookimpl(trylast=True)  # after pytest-django's own reordering
def pytest_collection_modifyitems(config, items):
    """Tests that stop or restart shared components run last, in their collected order; before them the
    tests of the real node (so it starts, lazily, after every test that does not ask for it). Tests of the
    worker's background processes get the test database (pytest-django creates it only when asked)."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker("disruptive") is not None,
            "real_node" in getattr(item, "fixturenames", ()),
        )
    )
    for item in items:
        uses_db = {"worker_stack", "worker_api"} & set(getattr(item, "fixturenames", ()))
        if uses_db and not item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.django_db)
    lanes.select(config, items)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """Each lane's own test database (``test_<name>_lane<i>``)."""
    from pytest_django.fixtures import _set_suffix_to_test_databases

    _set_suffix_to_test_databases(f"lane{lanes.LANE}")


_seconds: dict[str, float] = defaultdict(float)
_test_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    """Each file's seconds (set-up, call and tear-down: its fixtures' too), for dealing files to lanes; and each
    test's, to see where a lane's time goes."""
    _seconds[report.nodeid.split("::", 1)[0]] += report.duration
    _test_seconds[report.nodeid] += report.duration


def pytest_sessionfinish(session):
    if _seconds:
        out = lanes.state_dir() / "durations.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({k: round(v, 1) for k, v in sorted(_seconds.items())}, indent=1) + "\n")
        slowest = sorted(_test_seconds.items(), key=lambda item: -item[1])[:100]
        (out.parent / "slowest-tests.json").write_text(json.dumps(dict((k, round(v, 1)) for k, v in slowest), indent=1))
