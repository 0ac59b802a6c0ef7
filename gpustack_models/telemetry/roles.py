"""Prometheus metrics of the informers, the Celery worker and Celery beat (served on their metrics port,
``telemetry``). Labels name resources, tasks, outcomes, reasons and queues: never a namespace, an
object or a node.

Informers (``runinformers``):
- ``gpustack_models_informer_events_total{resource, type}``: watch events seen (ADDED, MODIFIED, DELETED);
- ``gpustack_models_informer_relists_total{resource}``: lists after the first (a 410 Expired, a lost watch);
- ``gpustack_models_informer_watch_restarts_total{resource}``: watches opened again after the first;
  both are series (at 0) from an informer's start;
- ``gpustack_models_informer_batches_sent_total{resource}``: mirror tasks of watch events sent to Celery.

Celery worker (sums its pool's processes):
- ``gpustack_models_tasks_total{task, outcome}``: tasks ended ``success``, ``failure``, ``retry`` or
  ``revoked``; ``gpustack_models_task_duration_seconds{task}``: how long they ran;
- ``gpustack_models_queue_depth{queue}``: messages waiting in the broker, read at scrape time (Redis:
  the queue's lists; the local file broker: its message files);
- ``gpustack_models_resolutions_total{outcome, reason}``: resolutions ``resolved``, ``failed`` (with the
  failure's reason), ``postponed`` (the namespace's share of the hubs spent) or ``gone``;
- ``gpustack_models_mirror_lag_seconds{resource}``: from an event's arrival at the informer to the commit
  of its mirror row (observed where the batch commits; one observation per coalesced entry).

Informers and beat: ``gpustack_models_tasks_sent_total{task}``, tasks they sent to the broker.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

INFORMER_EVENTS = Counter(
    "gpustack_models_informer_events_total", "Watch events the informers saw.", ["resource", "type"]
)
INFORMER_RELISTS = Counter(
    "gpustack_models_informer_relists_total", "Lists of a resource after its first one.", ["resource"]
)
INFORMER_WATCH_RESTARTS = Counter(
    "gpustack_models_informer_watch_restarts_total", "Watches opened again after the first.", ["resource"]
)
INFORMER_BATCHES = Counter(
    "gpustack_models_informer_batches_sent_total", "Mirror tasks of watch events sent to Celery.", ["resource"]
)
TASKS_SENT = Counter("gpustack_models_tasks_sent_total", "Tasks this process sent to the broker.", ["task"])
TASKS = Counter("gpustack_models_tasks_total", "Celery tasks ended, by outcome.", ["task", "outcome"])
TASK_DURATION = Histogram(
    "gpustack_models_task_duration_seconds",
    "Seconds a Celery task ran.",
    ["task"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
RESOLUTIONS = Counter("gpustack_models_resolutions_total", "Resolutions of artifacts.", ["outcome", "reason"])
MIRROR_LAG = Histogram(
    "gpustack_models_mirror_lag_seconds",
    "Seconds from a watch event's arrival at the informer to the commit of its mirror row.",
    ["resource"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)

OUTCOMES = {"Resolved": "resolved", "Postponed": "postponed", "Gone": "gone"}


def resolution(reason: str) -> None:
    """Count a resolution by its outcome's reason (``Resolved``, ``Postponed``, ``Gone`` or a failure's)."""
    outcome = OUTCOMES.get(reason, "failed")
    RESOLUTIONS.labels(outcome, "" if outcome != "failed" else reason).inc()


def mirror_lag(resource: str, arrivals, committed: float) -> None:
    histogram = MIRROR_LAG.labels(resource)
    for arrived in arrivals:
        if arrived is not None:
            histogram.observe(max(0.0, committed - arrived))


# --- Celery signals --------------------------------------------------------------------------------------

_started: dict[str, float] = {}


def _task_name(sender) -> str:
    return getattr(sender, "name", None) or str(sender)


def _prerun(sender=None, task_id=None, **kwargs):
    _started[task_id] = time.perf_counter()


def _postrun(sender=None, task_id=None, **kwargs):
    started = _started.pop(task_id, None)
    if started is not None:
        TASK_DURATION.labels(_task_name(sender)).observe(time.perf_counter() - started)


def _ended(outcome: str):
    def handler(sender=None, **kwargs):
        TASKS.labels(_task_name(sender) if sender is not None else "unknown", outcome).inc()

    handler.__name__ = f"_task_{outcome}"
    return handler


_HANDLERS = {outcome: _ended(outcome) for outcome in ("success", "failure", "retry", "revoked")}


def connect_worker_signals() -> None:
    from celery import signals

    signals.task_prerun.connect(_prerun, weak=False)
    signals.task_postrun.connect(_postrun, weak=False)
    signals.task_success.connect(_HANDLERS["success"], weak=False)
    signals.task_failure.connect(_HANDLERS["failure"], weak=False)
    signals.task_retry.connect(_HANDLERS["retry"], weak=False)
    signals.task_revoked.connect(_HANDLERS["revoked"], weak=False)


def _sent(sender=None, **kwargs):
    TASKS_SENT.labels(str(sender)).inc()


def count_sent_tasks() -> None:
    from celery import signals

    signals.after_task_publish.connect(_sent, weak=False)


# --- Queue depth, read at scrape time --------------------------------------------------------------------

REDIS_PRIORITY_SEPARATOR = "\x06\x16"
REDIS_PRIORITY_STEPS = (0, 3, 6, 9)


class QueueDepth(Collector):
    """``gpustack_models_queue_depth{queue}``: Redis ``LLEN`` of each queue's lists (kombu keeps one list
    per priority step), or the local file broker's message files; nothing for another broker, or when
    the broker does not answer within a second."""

    def __init__(self, app):
        self.app = app
        self._redis = None

    def queues(self) -> list[str]:
        names = [queue.name for queue in (self.app.conf.task_queues or ())]
        return names or [self.app.conf.task_default_queue]

    def collect(self):
        url = self.app.conf.broker_url or ""
        try:
            depths = self._redis_depths(url) if url.startswith(("redis", "rediss")) else self._file_depths()
        except Exception as exc:  # a scrape must not fail because the broker is away
            log.debug("queue depth not read: %s", exc)
            return
        if depths is None:
            return
        family = GaugeMetricFamily("gpustack_models_queue_depth", "Messages waiting in the broker.", labels=["queue"])
        for queue, depth in depths.items():
            family.add_metric([queue], depth)
        yield family

    def _redis_depths(self, url: str) -> dict[str, int]:
        if self._redis is None:
            import redis

            self._redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        pipe = self._redis.pipeline(transaction=False)
        queues = self.queues()
        for queue in queues:
            for step in REDIS_PRIORITY_STEPS:
                pipe.llen(f"{queue}{REDIS_PRIORITY_SEPARATOR}{step}" if step else queue)
        lengths = pipe.execute()
        steps = len(REDIS_PRIORITY_STEPS)
        return {queue: sum(lengths[i * steps : (i + 1) * steps]) for i, queue in enumerate(queues)}

    def _file_depths(self) -> dict[str, int] | None:
        folder = (self.app.conf.broker_transport_options or {}).get("data_folder_in")
        if not folder:
            return None
        names = [path.name for path in Path(folder).glob("*.msg")]
        return {queue: sum(name.endswith(f".{queue}.msg") for name in names) for queue in self.queues()}
