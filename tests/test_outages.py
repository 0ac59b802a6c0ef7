"""A Celery worker across outages of what it depends on (each found by the chaos run): a task carrying a
change is tried again, not dropped, while PostgreSQL or kube-apiserver is away, and no pool process keeps
failing on a connection the outage closed.

Real workers (prefork, two processes) on a Redis database of the module's own: one on a PostgreSQL of the
test's own, which it stops and starts again on the same data and port; one whose kube-apiserver is reached
through a relay the test opens only after the first try failed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import psycopg
import pytest
import yaml

from tests.services import PostgreSQL
from tests.support import REPO, wait_for
from tests.support.relay import relaying
from tests.support.worker import WorkerStack, celery_worker_argv, own_broker
from tests.test_shutdown import create_artifact, resolved_commit, spawn, tail

BROKER_INDEX = 2  # a lane's Redis database that this module empties and uses alone


@pytest.fixture
def own_database():
    server = PostgreSQL()
    url = server.start()
    env = dict(os.environ, DATABASE_URL=url)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True)
    yield server, url
    server.stop()


def artifact(namespace: str, name: str, version: int) -> dict:
    return {"apiVersion": "worker.gpustack.ai/v1alpha1", "kind": "ModelArtifact",
            "metadata": {"namespace": namespace, "name": name, "uid": f"u-{name}", "resourceVersion": str(version)},
            "spec": {"source": {"huggingFace": {"repository": f"org/{name}"}}}}  # fmt: skip


def mirrored(url: str, namespace: str) -> set[str]:
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            rows = conn.execute("SELECT name FROM gpustack_models_artifact WHERE namespace = %s", (namespace,))
            return {name for (name,) in rows}
    except psycopg.OperationalError:
        return set()


def test_a_worker_loses_no_change_and_keeps_no_dead_connection_across_a_postgresql_restart(
    own_database, tmp_path, monkeypatch
):
    from celery import Celery

    server, url = own_database
    broker = own_broker(BROKER_INDEX)
    env = dict(os.environ, DATABASE_URL=url, CELERY_BROKER_URL=broker, CELERY_RESULT_BACKEND=broker,
               GPUSTACK_DATA_DIR=str(tmp_path), KUBECONFIG=str(tmp_path / "none"))  # fmt: skip
    argv = celery_worker_argv(2)
    log, ns = tmp_path / "celery.log", f"ns-{uuid.uuid4().hex[:6]}"
    worker = spawn(argv, env, log)
    monkeypatch.setenv("CELERY_BROKER_URL", broker)
    version = iter(range(100, 10**6))
    try:
        with Celery("client", broker=broker, set_as_current=False) as client:

            def send(*names):
                entries = [["ADDED", artifact(ns, name, next(version)), 0.0, 1] for name in names]
                client.send_task("gpustack_models.mirror_events", args=["modelartifacts", entries])

            before = [f"before-{i}" for i in range(8)]
            for name in before:  # one batch each: both pool processes hold a connection when it goes
                send(name)
            wait_for(lambda: mirrored(url, ns) >= set(before), timeout=60, message=f"the first batches; {tail(log)}")
            server.halt()
            send("while-down")  # taken by a pool process while the database is away: tried again, not dropped
            wait_for(lambda: "Retry in" in log.read_text(), timeout=30, message=f"the batch tried again; {tail(log)}")
            server.serve()
            wait_for(lambda: "while-down" in mirrored(url, ns), timeout=60, message=f"the batch applied; {tail(log)}")
            marker = len(log.read_text())
            after = [f"after-{i}" for i in range(12)]
            for name in after:  # and reads outside a transaction, which never close a broken connection
                send(name)
                client.send_task("gpustack_models.check_mounts")
            wait_for(lambda: mirrored(url, ns) >= set(after), timeout=60, message=f"the later batches; {tail(log)}")
            wait_for(lambda: log.read_text()[marker:].count("check_mounts") >= 2 * len(after), timeout=60,
                     message=f"every read answered; {tail(log)}")  # fmt: skip
        later = log.read_text()[marker:].splitlines()
        failed = [line for line in later if "OperationalError" in line]
        assert not failed, failed  # every later task worked on its first try, in both pool processes
        assert sum("check_mounts" in line and "succeeded" in line for line in later) == len(after)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)


@pytest.mark.django_db  # the test database, created (pytest-django creates it only when asked)
def test_a_resolution_is_tried_again_while_kube_apiserver_is_unreachable(
    launcher, cluster, worker_kube, namespace, own_hub, db_url, tmp_path, monkeypatch
):
    from celery import Celery

    from gpustack_models.local.cluster import free_port

    repo = f"org/outage-{uuid.uuid4().hex[:6]}"
    commit = own_hub.add_hf_repo(repo, {"config.json": repo.encode()})
    create_artifact(worker_kube, namespace, "art", repo)
    port = free_port()  # nothing listens here until the relay opens: connections are refused
    config = yaml.safe_load(launcher.service_kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    broker = own_broker(BROKER_INDEX)
    env = dict(WorkerStack(launcher, own_hub, db_url).env(), CELERY_BROKER_URL=broker, CELERY_RESULT_BACKEND=broker,
               KUBECONFIG=str(kubeconfig))  # fmt: skip
    argv = celery_worker_argv(2)
    log = tmp_path / "celery.log"
    worker = spawn(argv, env, log)
    monkeypatch.setenv("CELERY_BROKER_URL", broker)
    try:
        with Celery("client", broker=broker, set_as_current=False) as client:
            client.send_task("gpustack_models.resolve_artifact", args=[namespace, "art"])
        wait_for(lambda: "Retry in" in log.read_text(), timeout=60, message=f"the task tried again; {tail(log)}")
        apiserver = ("127.0.0.1", int(cluster.server.rsplit(":", 1)[1]))
        with relaying(("127.0.0.1", port), lambda: [apiserver]):
            wait_for(lambda: resolved_commit(worker_kube, namespace, "art") == commit, timeout=90,
                     message=f"the artifact resolved once kube-apiserver answered; {tail(log)}")  # fmt: skip
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
