"""A real Celery worker takes a task through the test suite's broker and returns its result."""

import os
import subprocess
import sys
import uuid

import pytest
from django.conf import settings

from config.celery import app
from gpustack_models.reconcilers.tasks import ping

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def celery_worker():
    queue = f"test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "-Q",
            queue,
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "--loglevel=WARNING",
        ],
        cwd=REPO,
        env=dict(os.environ),
    )
    yield queue
    proc.terminate()
    proc.wait(30)


def test_it_uses_the_broker_the_test_command_started():
    expected = os.environ.get("GPUSTACK_TEST_BROKER", "redis")
    assert settings.CELERY_BROKER_URL.startswith(expected + "://"), settings.CELERY_BROKER_URL
    assert app.conf.broker_url == settings.CELERY_BROKER_URL


def test_it_round_trips_a_task_through_the_broker(celery_worker):
    payload = uuid.uuid4().hex
    result = ping.apply_async(args=[payload], queue=celery_worker)
    answer = result.get(timeout=60)
    assert answer["payload"] == payload
    assert answer["host"]
