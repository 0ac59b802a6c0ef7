"""A status write racing other writers on the real kube-apiserver (``reconcilers.writes.apply_status``): a
write another writer got in before is read and tried again; one that lost on every attempt raises
``StillConflicting``, which the task tries again later (tests/unit/reconcilers/test_tasks.py), instead of a
plain 409 that was raised out of the resolution and lost it (the soak's 20 label patches a second did that).

The suite's worker runs (``worker_stack``) and has resolved the artifact before the race starts: it is then at
rest (AccessDenied waits for a person), so every conflict is the test's own, and the test's writes are told
from the worker's by their field manager."""

from __future__ import annotations

import pytest

from gpustack_models import kube
from gpustack_models.reconcilers import writes
from tests.support import wait_for
from tests.test_shutdown import create_artifact

MANAGER = "status-race-test"  # the test's writes, told from the worker's (writes.RESOLVER) in managedFields


class RacingWriter:
    """The worker's own client, with another writer's label patch landing on the object between each of its
    first ``races`` reads and the apply that follows (what a busy tenant's writes do by chance)."""

    def __init__(self, client: kube.Kube, races: int):
        self.client, self.races, self.applies = client, races, 0
        self.written: bool | None = None  # what apply_status answered

    def get(self, path: str, **kwargs):
        return self.client.get(path, **kwargs)

    def apply(self, path: str, body: dict, **kwargs):
        self.applies += 1
        if self.races:
            self.races -= 1
            patch = {"metadata": {"labels": {"raced": str(self.applies)}}}
            self.client.json("PATCH", path.removesuffix("/status"), body=patch,
                             content_type="application/merge-patch+json")  # fmt: skip
        return self.client.apply(path, body, **kwargs)


def resolved(worker_kube, path: str) -> bool:
    """The worker has written its answer for a repository the hub does not hold: AccessDenied, at rest."""
    conditions = (worker_kube.get(path).get("status") or {}).get("conditions") or []
    return any(c.get("reason") == "AccessDenied" for c in conditions)


def managers(worker_kube, path: str) -> set[str]:
    """The field managers of the object's status subresource."""
    entries = worker_kube.get(path)["metadata"].get("managedFields") or []
    return {e["manager"] for e in entries if e.get("subresource") == "status"}


@pytest.fixture
def stored(worker_stack, worker_kube, namespace):
    """A ModelArtifact as kube-apiserver stores it, resolved by the worker and at rest: (its path, its
    metadata as the worker read it)."""
    created = create_artifact(worker_kube, namespace, "raced", "org/raced")
    path = writes.artifact_path(namespace, "raced")
    wait_for(lambda: resolved(worker_kube, path), timeout=60, message="the worker to resolve org/raced")
    assert MANAGER not in managers(worker_kube, path)
    return path, {"name": "raced", "namespace": namespace, "uid": created["metadata"]["uid"]}


def write(monkeypatch, worker_kube, stored, races: int) -> RacingWriter:
    racing = RacingWriter(worker_kube, races)
    monkeypatch.setattr(kube, "default", lambda: racing)
    path, metadata = stored
    status = {"observedGeneration": 1}
    racing.written = writes.apply_status(path, "ModelArtifact", metadata, status, MANAGER)
    return racing


def test_a_write_another_writer_got_in_before_is_read_and_tried_again(monkeypatch, worker_kube, stored):
    racing = write(monkeypatch, worker_kube, stored, races=writes.APPLY_ATTEMPTS - 1)
    assert racing.written is True and racing.applies == writes.APPLY_ATTEMPTS
    after = worker_kube.get(stored[0])
    assert after["status"]["observedGeneration"] == 1 and MANAGER in managers(worker_kube, stored[0])
    assert after["metadata"]["labels"]["raced"] == str(writes.APPLY_ATTEMPTS - 1)  # every race really landed


def test_a_write_that_lost_every_attempt_says_so_and_writes_nothing(monkeypatch, worker_kube, stored):
    with pytest.raises(kube.StillConflicting) as raised:
        write(monkeypatch, worker_kube, stored, races=writes.APPLY_ATTEMPTS)
    assert raised.value.code == 409 and isinstance(raised.value, kube.Conflict)
    assert "still conflicting after 5 attempts" in raised.value.message
    assert MANAGER not in managers(worker_kube, stored[0])
