"""The ``scenario`` fixture of the tests that run node plugins against the fake hub: a fresh namespace, the
worker's roles, and ``tests.test_plugins.Scenario`` to declare artifacts and prefetches, start plugins and
read what their stores report. The hub's faults are cleared after each test."""

from __future__ import annotations

import pytest


@pytest.fixture
def scenario(worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin):
    from tests.test_plugins import Scenario

    yield Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    hub.faults.clear()
