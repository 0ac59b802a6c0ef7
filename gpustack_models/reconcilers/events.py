"""Kubernetes Events, recorded the way Kubernetes' own controllers record them (``kubectl describe`` lists
them under the object).

``record`` writes a core/v1 Event about ``regarding`` in the object's namespace (``default`` for a
cluster-scoped object, where ``kubectl describe`` looks for those). Repeats aggregate into one series:
the same object, type, reason and series key within ``GPUSTACK_EVENT_SERIES_SECONDS`` raise the existing
Event's ``count`` and move its ``lastTimestamp`` (``x100 over 5m``) instead of creating another. New Events
are rate-limited per object by a token bucket (``GPUSTACK_EVENT_BURST`` at once, then one per
``GPUSTACK_EVENT_REFILL_SECONDS``), so a failing cluster cannot flood etcd with Event objects; a dropped
Event is counted in the log. The series and the buckets are rows of the database, shared by every Celery worker
process. Recording never fails the caller: any error is logged and dropped.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpustack_models import kube
from gpustack_models.kinds import GROUP, PUBLIC_VERSION
from gpustack_models.models import EventBudget, EventSeries

log = logging.getLogger(__name__)

COMPONENT = "gpustack-models"
NORMAL, WARNING = "Normal", "Warning"
MESSAGE_LIMIT = 1024
CLUSTER_SCOPED_NAMESPACE = "default"


def regarding(kind: str, name: str, uid: str, namespace: str = "") -> dict:
    """What an Event is about: an object of this API (``namespace`` empty for a cluster-scoped one)."""
    about = {"apiVersion": f"{GROUP}/{PUBLIC_VERSION}", "kind": kind, "name": name, "uid": uid}
    if namespace:
        about["namespace"] = namespace
    return about


def record(regarding: dict, type_: str, reason: str, message: str, *, series_key: str = "") -> None:
    """Record that ``reason`` happened to ``regarding`` (``apiVersion, kind, name, namespace, uid``;
    no namespace for a cluster-scoped object). ``type_`` is ``Normal`` or ``Warning``."""
    kind = regarding.get("kind")
    try:
        _record(regarding, type_, reason, message[:MESSAGE_LIMIT], series_key)
    except kube.StatusError as exc:  # e.g. the namespace is being deleted
        log.info("could not record the Event %s on %s %s: %s", reason, kind, _named(regarding), exc)
    except Exception:  # an Event is never worth failing the work it describes
        log.warning("could not record the Event %s on %s %s", reason, kind, _named(regarding), exc_info=True)


def _named(regarding: dict) -> str:
    ns = regarding.get("namespace")
    return f"{ns}/{regarding.get('name')}" if ns else str(regarding.get("name"))


def _record(regarding: dict, type_: str, reason: str, message: str, series_key: str) -> None:
    uid = regarding["uid"]
    now = timezone.now()
    window = timedelta(seconds=settings.EVENT_SERIES_SECONDS)
    with transaction.atomic():
        series, _ = EventSeries.objects.select_for_update().get_or_create(
            object_uid=uid,
            type=type_,
            reason=reason,
            series_key=series_key,
            defaults={"event_namespace": "", "event_name": "", "first_seen": now, "last_seen": now},
        )
        if series.event_name and now - series.last_seen <= window and _repeat(series, message, now):
            return
        if not _allowed(uid, now, reason, regarding):
            return
        _create(series, regarding, type_, reason, message, now)


def _event_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/events" + (f"/{name}" if name else "")


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _repeat(series: EventSeries, message: str, now: datetime) -> bool:
    """Count one more of the series on its Event; False when that Event is gone (expired)."""
    patch = {"count": series.count + 1, "lastTimestamp": _stamp(now), "message": message}
    try:
        kube.default().json(
            "PATCH",
            _event_path(series.event_namespace, series.event_name),
            body=patch,
            content_type="application/merge-patch+json",
        )
    except kube.NotFound:
        return False
    series.count += 1
    series.last_seen = now
    series.save(update_fields=["count", "last_seen"])
    return True


def _create(series: EventSeries, regarding: dict, type_: str, reason: str, message: str, now: datetime) -> None:
    involved = {k: regarding[k] for k in ("apiVersion", "kind", "name", "uid")}
    if regarding.get("namespace"):
        involved["namespace"] = regarding["namespace"]
    namespace = regarding.get("namespace") or CLUSTER_SCOPED_NAMESPACE
    name = f"{regarding['name'][:230]}.{time.time_ns():x}"
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": COMPONENT},
        "firstTimestamp": _stamp(now),
        "lastTimestamp": _stamp(now),
        "count": 1,
        "reportingComponent": COMPONENT,
    }
    kube.default().create(_event_path(namespace), body)
    series.event_namespace, series.event_name = namespace, name
    series.count, series.first_seen, series.last_seen = 1, now, now
    series.save(update_fields=["event_namespace", "event_name", "count", "first_seen", "last_seen"])


def _allowed(uid: str, now: datetime, reason: str, regarding: dict) -> bool:
    """Spend one of the object's new-Event tokens; False (logged) when it has none left."""
    rate = 1.0 / settings.EVENT_REFILL_SECONDS
    burst = float(settings.EVENT_BURST)
    budget, _ = EventBudget.objects.select_for_update().get_or_create(
        object_uid=uid, defaults={"tokens": burst, "refilled_at": now}
    )
    elapsed = max(0.0, (now - budget.refilled_at).total_seconds())
    budget.tokens = min(burst, budget.tokens + elapsed * rate)
    budget.refilled_at = now
    allowed = budget.tokens >= 1.0
    if allowed:
        budget.tokens -= 1.0
    else:
        budget.suppressed += 1
        log.info(
            "Event %s on %s %s suppressed by the rate limit (%d suppressed on it so far)",
            reason,
            regarding.get("kind"),
            _named(regarding),
            budget.suppressed,
        )
    budget.save(update_fields=["tokens", "refilled_at", "suppressed"])
    return allowed


def purge() -> int:
    """Forget series past their window and buckets long full again."""
    now = timezone.now()
    removed = EventSeries.objects.filter(last_seen__lt=now - timedelta(seconds=settings.EVENT_SERIES_SECONDS)).delete()
    full = timedelta(seconds=settings.EVENT_REFILL_SECONDS * settings.EVENT_BURST)
    return removed[0] + EventBudget.objects.filter(refilled_at__lt=now - full).delete()[0]
