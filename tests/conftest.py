"""The suite's plugins: fixtures live in ``tests.support`` (helpers importable from there too)."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.support.cluster",
    "tests.support.worker",
    "tests.support.plugins",
    "tests.support.stores",
    "tests.fakehub.fixtures",
]


@pytest.hookimpl(trylast=True)  # after pytest-django's own reordering
def pytest_collection_modifyitems(config, items):
    """Tests that stop or restart shared components run last, in their collected order. Tests of the
    worker's background processes get the test database (pytest-django creates it only when asked)."""
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)
    for item in items:
        uses_db = {"worker_stack", "worker_api"} & set(getattr(item, "fixturenames", ()))
        if uses_db and not item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.django_db)
