"""Test support: helpers (``waiting``, ``kubernetes``, ``paths``, ``pods``: Pods mounting a model and the
kubelet's volume ids) and the fixtures the root conftest loads with ``pytest_plugins`` (``cluster``,
``worker``, ``plugins``, ``stores``, ``mounts``, ``kubelet``: the real node)."""

from tests.support.kubernetes import (
    kube_update,
    kubectl_run,
    read_modify_write,
    status_of,
    token_http,
    wait_default_service_account,
)
from tests.support.paths import PEER_PORT, PLUGIN_PORT, REPO, TEST_STATE
from tests.support.waiting import wait_for

__all__ = [
    "PEER_PORT",
    "PLUGIN_PORT",
    "REPO",
    "TEST_STATE",
    "kube_update",
    "kubectl_run",
    "read_modify_write",
    "status_of",
    "token_http",
    "wait_default_service_account",
    "wait_for",
]
