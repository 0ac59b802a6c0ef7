"""What a process made while starting is set aside from the garbage collector (``startup_objects``), so the cycles
failed tasks leave are collected as they come instead of piling up: each run in a process of its own (a
freeze cannot be undone), failing a task hundreds of times through Celery's own tracer, as a pool process
runs it, and counting how many of the tasks' exception infos (each a cycle holding its frames' code
positions) were alive at once. Before the fix the soak saw each Celery pool process grow about 1 MB a minute."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.paths import REPO

CHILD = """
import gc, json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
import django
django.setup()
from celery import signals
from celery.app.trace import build_tracer
from config.celery import app
from gpustack_models import kube

@app.task(name="tests.fails_deep", ignore_result=True)
def fails_deep():
    def deeper(depth):
        if depth == 0:
            raise kube.StillConflicting("status still conflicting after 5 attempts")
        return deeper(depth - 1)
    return deeper(12)

if sys.argv[1] == "pool-process":  # what a prefork pool process hears once forked
    signals.worker_process_init.send(sender=None)
elif sys.argv[1] == "api-worker":  # what gunicorn calls once an API worker has loaded the application
    from gpustack_models.api import gunicorn_conf
    gunicorn_conf.post_worker_init(None)
tracer = build_tracer(fails_deep.name, fails_deep, eager=False, propagate=False, app=app)
most = 0
for i in range(600):
    tracer(f"task-{i}", (), {}, {"hostname": "test", "delivery_info": {}})
    if i % 25 == 24:
        most = max(most, sum(type(o).__name__ == "ExceptionInfo" for o in gc.get_objects()))
print(json.dumps({"most_alive": most, "set_aside": gc.get_freeze_count()}))
"""


def failing_tasks(started_as: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, started_as],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_pool_process_collects_its_failed_tasks_cycles_as_they_come():
    before = failing_tasks("unchanged")  # how a pool process ran before: nothing set aside
    after = failing_tasks("pool-process")
    assert before["set_aside"] == 0 and after["set_aside"] > 10_000, (before, after)
    # Measured: 133 exception infos alive at once before, 14 after (a full collection about every 10 tasks).
    assert after["most_alive"] <= 30 and before["most_alive"] >= 3 * after["most_alive"], (before, after)


def test_an_api_worker_sets_aside_what_it_loaded():
    worker = failing_tasks("api-worker")
    assert worker["set_aside"] > 10_000 and worker["most_alive"] <= 30, worker
