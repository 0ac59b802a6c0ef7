"""PostgreSQL restarting under a running Celery worker (found by the chaos run): the worker's pool processes
must neither drop the changes they were given while the database was away nor keep failing on the
connections the restart closed.

A real worker (prefork, two processes) on a PostgreSQL of the test's own, which it stops and starts again on
the same data and port, and on a Redis database of its own. Mirror batches (the informers' events) are sent
before, during and after the outage; what must hold is read from that database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import psycopg
import pytest

from tests.services import PostgreSQL
from tests.support import REPO, wait_for
from tests.support.worker import own_broker
from tests.test_shutdown import spawn, tail

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
    argv = [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=prefork", "--concurrency=2",
            "--without-gossip", "--without-mingle", "--loglevel=INFO"]  # fmt: skip
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
