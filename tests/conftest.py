"""The suite's plugins: fixtures live in ``tests.support`` (helpers importable from there too)."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.support.cluster",
    "tests.support.worker",
    "tests.support.plugins",
    "tests.support.stores",
    "tests.support.kubelet",
    "tests.support.image_build",
    "tests.support.helm",
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
