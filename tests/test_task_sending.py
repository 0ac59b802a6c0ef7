"""A task sent by name (the informers, which do not import the task module) goes out with its result
ignored, as the registered tasks' results are: Celery's Redis result backend would otherwise subscribe to the
result's channel for each task sent (two more Redis commands per task, at up to 1,000 informer events a
second, waiting for a result no task writes)."""

from __future__ import annotations

import json
from datetime import timedelta

import redis
from celery import Celery
from django.utils import timezone

from gpustack_models.informers import sending
from tests.support.worker import own_broker

BROKER_INDEX = 2  # a lane's Redis database that tests empty and use one at a time (no worker reads it)


def test_a_task_sent_by_name_is_queued_without_waiting_for_its_result():
    url = own_broker(BROKER_INDEX)
    app = Celery("sending-test", set_as_current=False)
    # Written here, not where CELERY_BROKER_URL points (the session's broker: Celery prefers the variable).
    app.conf.update(broker_write_url=url, result_backend=url, task_ignore_result=True)
    previous = sending.current_app._get_current_object()
    app.set_current()
    try:
        sending.send("gpustack_models.not_registered_here", "ns", "name")
        sending.send_at(timezone.now() + timedelta(hours=1), "gpustack_models.not_registered_here", "node")
        consumer = app.backend.result_consumer
        assert consumer._pubsub is None and not consumer.subscribed_to, consumer.subscribed_to
    finally:
        previous.set_current()
    queued = [json.loads(m) for m in redis.Redis.from_url(url).lrange("celery", 0, -1)]
    assert sorted(m["headers"]["argsrepr"] for m in queued) == ["('node',)", "('ns', 'name')"]
    assert all(m["headers"]["ignore_result"] for m in queued), queued
