"""A status write racing other writers on the real kube-apiserver (``reconcilers.writes.apply_status``): a
write another writer got in before is read and tried again; one that lost on every attempt raises
``StillConflicting``, which the task tries again later (tests/unit/reconcilers/test_tasks.py), instead of a
plain 409 that was raised out of the resolution and lost it (the soak's 20 label patches a second did that)."""

from __future__ import annotations

import pytest

from gpustack_models import kube
from gpustack_models.reconcilers import writes
from tests.test_shutdown import create_artifact


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


@pytest.fixture
def stored(worker_kube, namespace):
    """A ModelArtifact as kube-apiserver stores it: (its path, its metadata as the worker read it)."""
    created = create_artifact(worker_kube, namespace, "raced", "org/raced")
    return writes.artifact_path(namespace, "raced"), {"name": "raced", "namespace": namespace,
                                                       "uid": created["metadata"]["uid"]}  # fmt: skip


def write(monkeypatch, worker_kube, stored, races: int) -> RacingWriter:
    racing = RacingWriter(worker_kube, races)
    monkeypatch.setattr(kube, "default", lambda: racing)
    path, metadata = stored
    status = {"observedGeneration": 1}
    racing.written = writes.apply_status(path, "ModelArtifact", metadata, status, writes.RESOLVER)
    return racing


def test_a_write_another_writer_got_in_before_is_read_and_tried_again(monkeypatch, worker_kube, stored):
    racing = write(monkeypatch, worker_kube, stored, races=writes.APPLY_ATTEMPTS - 1)
    assert racing.written is True and racing.applies == writes.APPLY_ATTEMPTS
    after = worker_kube.get(stored[0])
    assert after["status"]["observedGeneration"] == 1
    assert after["metadata"]["labels"]["raced"] == str(writes.APPLY_ATTEMPTS - 1)  # every race really landed


def test_a_write_that_lost_every_attempt_says_so_and_writes_nothing(monkeypatch, worker_kube, stored):
    with pytest.raises(kube.StillConflicting) as raised:
        write(monkeypatch, worker_kube, stored, races=writes.APPLY_ATTEMPTS)
    assert raised.value.code == 409 and isinstance(raised.value, kube.Conflict)
    assert "still conflicting after 5 attempts" in raised.value.message
    assert "observedGeneration" not in (worker_kube.get(stored[0]).get("status") or {})
