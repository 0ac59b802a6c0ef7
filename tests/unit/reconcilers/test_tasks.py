"""Which failures a task carrying a change is tried again after, run as a worker runs it (Celery's own retry
machinery, applied in process: a retry runs at once)."""

import pytest

from gpustack_models import kube
from gpustack_models.reconcilers import node_stores, tasks


@pytest.fixture
def failing_first(monkeypatch):
    """The node store's reconcile fails with ``error`` on its first call, then answers."""
    calls = []

    def set_error(error):
        def reconcile(node):
            calls.append(node)
            if len(calls) == 1:
                raise error
            return f"reconciled {node}"

        monkeypatch.setattr(node_stores, "reconcile_node_store", reconcile)
        return calls

    return set_error


@pytest.mark.parametrize(
    "error",
    [
        kube.error_for(403, {"kind": "Status", "reason": "Forbidden", "message": "RBAC caches not filled yet"}),
        kube.error_for(401, {"kind": "Status", "reason": "Unauthorized"}),
        kube.error_for(503, {"kind": "Status", "reason": "ServiceUnavailable"}),
        kube.error_for(429, {"kind": "Status", "reason": "TooManyRequests", "message": "storage is (re)initializing"}),
        ConnectionRefusedError(111, "Connection refused"),
        # A status write that lost to other writers on each attempt (the soak's 20 writes a second): raised out,
        # its change was lost (the resolution's ``raised unexpected: Conflict`` in the soak's worker log).
        kube.StillConflicting("status of /apis/x still conflicting after 5 attempts"),
    ],
    ids=["403-starting", "401-starting", "503", "429", "refused", "still-conflicting"],
)
def test_a_reconcile_is_tried_again_after_a_failure_that_passes(failing_first, error):
    calls = failing_first(error)
    result = tasks.reconcile_node_store.apply(args=["gpu-1"])
    assert result.successful() and result.result == "reconciled gpu-1"
    assert calls == ["gpu-1", "gpu-1"]


@pytest.mark.parametrize("code", [404, 409, 422])
def test_a_reconcile_is_not_tried_again_after_an_answer_that_stays(failing_first, code):
    calls = failing_first(kube.error_for(code, {"kind": "Status"}))
    result = tasks.reconcile_node_store.apply(args=["gpu-1"])
    assert result.failed() and isinstance(result.result, kube.StatusError) and calls == ["gpu-1"]
