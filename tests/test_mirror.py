"""The mirror converges on the cluster, whatever happens to the informers, kube-apiserver or event order."""

import os
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpustack_models.kinds import GROUP
from gpustack_models.kube.errors import StatusError, TooManyRequests
from gpustack_models.models import Artifact, InformerState, NodeStore
from tests.support import wait_for

STORAGE = f"/apis/{GROUP}/v1alpha1"


def artifact_body(name):
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"name": name},
        "spec": {"source": {"huggingFace": {"repository": "mirror/unknown"}}},
    }  # resolves once: AccessDenied


def store_body(name):
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "NodeModelStore",
        "metadata": {"name": name},
        "spec": {"models": []},
    }


class Population:
    """A namespace of artifacts and a set of node stores the test creates, changes and deletes."""

    def __init__(self, kube, namespace, prefix):
        self.kube, self.ns, self.prefix = kube, namespace, prefix
        self.pool = ThreadPoolExecutor(8)

    def artifacts_url(self):
        return f"{STORAGE}/namespaces/{self.ns}/modelartifacts"

    def authorized(self) -> bool:
        """Whether kube-apiserver lets this client list again (its RBAC caches fill in its first moments)."""
        try:
            self.kube.get(self.artifacts_url())
            return True
        except StatusError:
            return False

    def create(self, artifacts: int, stores: int, start: int = 0):
        list(
            self.pool.map(
                lambda i: self.kube.create(self.artifacts_url(), artifact_body(f"a-{i:04d}")),
                range(start, start + artifacts),
            )
        )
        list(
            self.pool.map(
                lambda i: self.kube.create(f"{STORAGE}/nodemodelstores", store_body(f"{self.prefix}-{i:03d}")),
                range(start, start + stores),
            )
        )

    def label(self, artifact_ids, store_ids, value):
        patch = {"metadata": {"labels": {"round": value}}}
        list(
            self.pool.map(
                lambda i: self.kube.json(
                    "PATCH",
                    f"{self.artifacts_url()}/a-{i:04d}",
                    body=patch,
                    content_type="application/merge-patch+json",
                ),
                artifact_ids,
            )
        )
        list(
            self.pool.map(
                lambda i: self.kube.json(
                    "PATCH",
                    f"{STORAGE}/nodemodelstores/{self.prefix}-{i:03d}",
                    body=patch,
                    content_type="application/merge-patch+json",
                ),
                store_ids,
            )
        )

    def delete(self, artifact_ids, store_ids):
        list(self.pool.map(lambda i: self.kube.delete(f"{self.artifacts_url()}/a-{i:04d}"), artifact_ids))
        list(self.pool.map(lambda i: self.kube.delete(f"{STORAGE}/nodemodelstores/{self.prefix}-{i:03d}"), store_ids))

    def cluster_state(self):
        arts = {
            i["metadata"]["name"]: int(i["metadata"]["resourceVersion"])
            for i in self.kube.get(self.artifacts_url())["items"]
        }
        stores = {
            i["metadata"]["name"]: int(i["metadata"]["resourceVersion"])
            for i in self.kube.get(f"{STORAGE}/nodemodelstores")["items"]
            if i["metadata"]["name"].startswith(self.prefix)
        }
        return arts, stores

    def mirror_state(self):
        arts = dict(Artifact.objects.live().filter(namespace=self.ns).values_list("name", "resource_version"))
        stores = dict(
            NodeStore.objects.live().filter(name__startswith=self.prefix).values_list("name", "resource_version")
        )
        return arts, stores

    def converged(self, timeout=60):
        def same():
            try:
                cluster = self.cluster_state()
            except TooManyRequests:  # a kube-apiserver just restarted: "storage is (re)initializing"
                return None
            return cluster if self.mirror_state() == cluster else None

        return wait_for(same, timeout=timeout, interval=0.5, message="the mirror to equal the cluster")

    def cleanup(self):
        for name in self.cluster_state()[1]:
            self.kube.delete(f"{STORAGE}/nodemodelstores/{name}")


@pytest.fixture
def population(worker_stack, worker_kube, namespace):
    pop = Population(worker_kube, namespace, f"m{uuid.uuid4().hex[:5]}")
    yield pop
    pop.cleanup()


def test_it_converges_after_creating_changing_and_deleting_many_objects(population):
    population.create(200, 50)
    population.label(range(0, 200, 2), range(0, 50, 2), "one")
    population.delete(range(150, 200), range(40, 50))
    arts, stores = population.converged()
    assert len(arts) == 150 and len(stores) == 40
    labelled = Artifact.objects.live().get(namespace=population.ns, name="a-0002")
    assert labelled.body["metadata"]["labels"] == {"round": "one"}


def test_it_converges_after_the_informers_were_killed(population, worker_stack):
    population.create(40, 10)
    population.converged()
    worker_stack.stop("informers", kill=True)
    try:
        population.delete(range(0, 10), range(0, 3))
        population.label(range(10, 20), range(3, 6), "while-down")
        population.create(5, 2, start=100)
    finally:
        worker_stack.start("informers")
    arts, stores = population.converged()
    assert "a-0000" not in arts and "a-0100" in arts and len(arts) == 35 and len(stores) == 9


@pytest.mark.django_db(transaction=False)
def test_it_keeps_the_newest_version_whatever_the_event_order():
    from gpustack_models.reconcilers.tasks import mirror_event

    ns, name = f"order-{uuid.uuid4().hex[:6]}", "x"

    def version(rv, label):
        body = artifact_body(name)
        body["metadata"].update(namespace=ns, resourceVersion=str(rv), uid="u1", labels={"v": label})
        return body

    events = [("ADDED", version(10, "a")), ("MODIFIED", version(11, "b")), ("MODIFIED", version(12, "c"))]
    for kind, obj in reversed(events + events):
        mirror_event.run("modelartifacts", kind, obj)
    row = Artifact.objects.get(namespace=ns, name=name)
    assert (row.resource_version, row.body["metadata"]["labels"], row.deleted) == (12, {"v": "c"}, False)
    # A deletion is kept against older events arriving late, and twice is the same as once.
    deleted = version(13, "c")
    assert mirror_event.run("modelartifacts", "DELETED", deleted) is True
    assert mirror_event.run("modelartifacts", "DELETED", deleted) is False
    assert mirror_event.run("modelartifacts", "MODIFIED", version(12, "c")) is False
    row.refresh_from_db()
    assert row.deleted and row.resource_version == 13
    assert not Artifact.objects.live().filter(namespace=ns).exists()


@pytest.mark.disruptive
def test_it_relists_on_410_and_converges_after_kube_apiserver_restarts(population, worker_stack, cluster):
    """Freeze the informers and restart kube-apiserver; change the cluster through the new one, compact etcd
    and restart kube-apiserver again: the informers come back with a resourceVersion that is gone, are told
    410 Expired, and relist. (The changes are made after the first restart because the kube-apiserver that
    stops may already have sent their events, which the frozen informers then read on waking and resume
    from the newest version, which the next watch cache still holds: no 410.)"""
    population.create(20, 5)
    population.converged()
    before = InformerState.objects.get(resource="modelartifacts").expired
    informers = worker_stack.procs["informers"]
    os.kill(informers.pid, signal.SIGSTOP)
    try:
        cluster.restart_apiserver()
        wait_for(population.authorized, timeout=30, message="kube-apiserver authorizing the worker again")
        population.delete(range(0, 5), range(0, 2))
        population.label(range(5, 15), range(2, 4), "frozen")
        population.create(3, 1, start=200)
        cluster.compact_etcd()
        cluster.restart_apiserver()  # its watch cache starts past every version the informers hold
    finally:
        os.kill(informers.pid, signal.SIGCONT)
    arts, stores = population.converged(timeout=120)
    assert len(arts) == 18 and len(stores) == 4
    wait_for(
        lambda: InformerState.objects.get(resource="modelartifacts").expired > before,
        timeout=30,
        message="the informer to record a 410 relist",
    )
