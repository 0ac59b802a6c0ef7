"""A Celery pool process whose memory passed ``GPUSTACK_CELERY_MAX_MEMORY_PER_CHILD_MB`` is replaced by a fresh
one when its task ends, and the worker goes on answering: under a steady load the pool processes grow, and a
worker Pod's memory limit must not be what stops them. A real worker on the suite's Redis."""

from __future__ import annotations

import os
import signal
import uuid

import psutil
import pytest
from celery import Celery

from tests.support import wait_for
from tests.support.worker import celery_worker_argv, own_broker
from tests.test_shutdown import spawn, tail

BROKER_INDEX = 2  # a lane's Redis database that tests empty and use one at a time (no other worker reads it)


def pool_pids(worker) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(worker.pid).children()}
    except psutil.NoSuchProcess:
        return set()


@pytest.mark.parametrize("limit_mb, replaced", [("1", True), ("0", False)])
def test_a_pool_process_past_its_memory_limit_is_replaced_after_its_task(limit_mb, replaced, tmp_path):
    broker = own_broker(BROKER_INDEX)
    env = dict(os.environ, CELERY_BROKER_URL=broker, CELERY_RESULT_BACKEND=broker, GPUSTACK_DATA_DIR=str(tmp_path),
               KUBECONFIG=str(tmp_path / "none"), GPUSTACK_CELERY_MAX_MEMORY_PER_CHILD_MB=limit_mb)  # fmt: skip
    argv = celery_worker_argv(1)
    log = tmp_path / "celery.log"
    worker = spawn(argv, env, log)
    try:
        with Celery("client", broker=broker, backend=broker, set_as_current=False) as client:
            client.conf.broker_write_url = broker  # not where CELERY_BROKER_URL points (Celery prefers it)

            def ping() -> dict:
                payload = uuid.uuid4().hex
                answer = client.send_task("gpustack_models.ping", args=[payload]).get(timeout=60)
                assert answer["payload"] == payload, answer
                return answer

            wait_for(lambda: len(pool_pids(worker)) == 1, timeout=60, message=f"the pool process; {tail(log)}")
            first = pool_pids(worker)
            ping()
            if replaced:  # 1 MB: passed by every process at its first task
                wait_for(lambda: pool_pids(worker) - first, timeout=30, message=f"a new pool process; {tail(log)}")
            ping()  # answered, by the new process where the old one went
            assert (pool_pids(worker) != first) is replaced, (first, pool_pids(worker))
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
