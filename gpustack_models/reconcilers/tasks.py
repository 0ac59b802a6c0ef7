"""Celery tasks: thin entry points into ``gpustack_models.reconcilers``. Each takes ids or small payloads and
is safe to run twice, in any order. Each is named (``informers.sending``, ``task_names``): whoever enqueues
one sends it by that name, so no module imports this one but Celery's task discovery.

Mirror tasks apply informer events (one, or a batch the informer coalesced, or a relist page) and then run
the reactions the reconcilers declared (``informers.reactions``: what each change concerns, enqueued once
per batch and key); the reconcilers read the mirror and write to Kubernetes as the service.
"""

from __future__ import annotations

import logging
import socket
import time
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections
from django.utils import timezone

from gpustack_models import kube
from gpustack_models.informers import lag, mirror, sending
from gpustack_models.informers.reactions import once_per_key, react
from gpustack_models.models import Artifact, InformerState, NodeStore, PluginPod, Prefetch
from gpustack_models.reconcilers import (  # each declares its reactions to the mirror's changes on import
    collection,
    events,
    mount_checks,
    node_labels,
    node_stores,
    prefetches,
    resolution,
    retries,
    rollup,
    selection,
    store_events,  # noqa: F401 (imported for the reactions it declares)
)
from gpustack_models.reconcilers import task_names as names
from gpustack_models.telemetry import roles

log = logging.getLogger(__name__)

# A task that carries a change (events to mirror, an object to reconcile, Events to record) is tried again
# while the database or kube-apiserver is unreachable or just restarted (a restart, a failover; kube-apiserver
# refuses with 401/403 until its caches are filled): with backoff from 1 s to 30 s,
# for about ten minutes. Raised out, an acks_late task is acknowledged all the same, and its change was lost
# (a relist at the same resourceVersion changes nothing, so nothing would enqueue it again). Periodic tasks
# are not tried again: beat sends the next one. So is a status write that lost to other writers on each of its
# attempts (``StillConflicting``: under a burst of writes to the same object, which the soak makes), tried
# again after a backoff, not raised out with its change lost.
WHILE_UNREACHABLE = {
    "autoretry_for": (OperationalError, InterfaceError, *kube.STARTING, kube.StillConflicting),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": 25,
}


@shared_task(name="gpustack_models.ping", ignore_result=False)
def ping(payload: str) -> dict:
    """Answer with the payload and this Celery worker's host: a health check of the broker round trip."""
    return {"payload": payload, "host": socket.gethostname()}


# --- The mirror ------------------------------------------------------------------------------------------


@shared_task(name=sending.MIRROR_EVENT, acks_late=True, **WHILE_UNREACHABLE)
def mirror_event(resource: str, event_type: str, obj: dict, arrived: float | None = None) -> bool:
    """Apply one watch event (ADDED, MODIFIED, DELETED) to the mirror (``arrived``: when the informer
    got it, for the lag)."""
    kind = mirror.KINDS[resource]
    (change,) = mirror.apply_events(kind, [(event_type, obj)])
    if arrived is not None:
        committed = time.time()
        roles.mirror_lag(resource, (arrived,), committed)
        lag.record([lag.line(resource, obj, 1, arrived, committed)])
    if change.applied:
        react(kind, change)
    return change.applied


@shared_task(name=sending.MIRROR_EVENTS, acks_late=True, **WHILE_UNREACHABLE)
def mirror_events(resource: str, entries: list[list]) -> dict:
    """Apply a batch of watch events the informer coalesced (``[type, object, arrived, events]`` each,
    an object's in order) in one transaction; then enqueue what the changes concern, once per task and
    arguments."""
    kind = mirror.KINDS[resource]
    changes = mirror.apply_events(kind, [(entry[0], entry[1]) for entry in entries])
    committed = time.time()
    roles.mirror_lag(resource, (entry[2] for entry in entries), committed)
    lag.record([lag.line(resource, e[1], e[3], e[2], committed) for e in entries])
    with once_per_key() as enqueued:
        for change in changes:
            if change.applied:
                react(kind, change)
    return {"applied": sum(c.applied for c in changes), "enqueued": enqueued}


@shared_task(name=sending.MIRROR_BATCH, acks_late=True, **WHILE_UNREACHABLE)
def mirror_batch(resource: str, objects: list[dict]) -> int:
    """Apply the objects of a (re)list."""
    kind = mirror.KINDS[resource]
    changes = mirror.apply_events(kind, [("ADDED", obj) for obj in objects])
    with once_per_key():
        for change in changes:
            if change.applied:
                react(kind, change)
    return sum(c.applied for c in changes)


@shared_task(name=sending.MIRROR_PRUNE, acks_late=True, **WHILE_UNREACHABLE)
def mirror_prune(resource: str, keys: list[dict], list_rv: int) -> int:
    """Remove what a relist at ``list_rv`` no longer returned."""
    kind = mirror.KINDS[resource]
    removed = mirror.prune(kind, keys, list_rv)
    with once_per_key():
        for body in removed:
            react(kind, mirror.Change(True, body, None))
    return len(removed)


@shared_task(name=sending.RECORD_INFORMER, **WHILE_UNREACHABLE)
def record_informer(resource: str, resource_version: str, relisted: bool, expired: bool) -> None:
    state, _ = InformerState.objects.get_or_create(resource=resource)
    state.resource_version = resource_version
    state.relists += int(relisted)
    state.expired += int(expired)
    state.save()


# --- Reconcilers -----------------------------------------------------------------------------------------


@shared_task(name=names.RESOLVE_ARTIFACT, acks_late=True, **WHILE_UNREACHABLE)
def resolve_artifact(namespace: str, name: str, attempt: int = 0, force: bool = False) -> str:
    """Resolve an artifact's source to a commit and manifest digest and write its status (``force``: even
    when resolved for its generation, as the requested-at annotation asks).

    Temporary failures (hub unavailable, Secret or claim missing) retry with backoff; they never remove
    an earlier resolution. An attempt the namespace's share of the hubs cannot pay for yet waits for it
    without counting as a failure. Failures a person must fix are tried again by ``retries``."""
    outcome = resolution.resolve_artifact(namespace, name, force=force, attempt=attempt)
    roles.resolution(outcome.reason)
    if outcome.reason == "Gone":
        retries.forget(namespace, name)
    if not outcome.retry:
        return outcome.reason
    if outcome.postponed:
        countdown, next_attempt = outcome.retry_after, attempt
    else:
        countdown, next_attempt = retries.temporary_countdown(attempt, outcome.retry_after), attempt + 1
    resolve_artifact.apply_async((namespace, name), {"attempt": next_attempt, "force": force}, countdown=countdown)
    return outcome.reason


@shared_task(name=names.RECONCILE_NODE_STORE, acks_late=True, **WHILE_UNREACHABLE)
def reconcile_node_store(node: str) -> str:
    return node_stores.reconcile_node_store(node)


@shared_task(name=names.RETARGET_PREFETCH, acks_late=True, **WHILE_UNREACHABLE)
def retarget_prefetch(namespace: str, name: str) -> int:
    """A prefetch's spec changed: its targets again, then the nodes it concerns and its status."""
    nodes = selection.retarget_prefetch(namespace, name)
    for node in sorted(nodes):
        reconcile_node_store.delay(node)
    reconcile_prefetch.delay(namespace, name)
    _roll_up_prefetch(namespace, name)  # the nodes its namespace asks for changed (or it is gone)
    return len(nodes)


def _roll_up(namespace: str, artifact: str | None) -> None:
    """The artifact's roll-up (its ``Ready`` follows the nodes its namespace asks for)."""
    if not artifact:
        return
    digest = Artifact.objects.live().filter(namespace=namespace, name=artifact).values_list("digest", flat=True)
    digest = digest.first()
    if digest:
        rollup_digest.delay(digest)


def _roll_up_prefetch(namespace: str, name: str) -> None:
    row = Prefetch.objects.filter(namespace=namespace, name=name).values_list("artifact_name", flat=True).first()
    _roll_up(namespace, row)


@shared_task(name=names.RETARGET_NODE, acks_late=True, **WHILE_UNREACHABLE)
def retarget_node(node: str) -> int:
    """A node's labels, existence or plugin changed: which label-selecting prefetches target it."""
    changed = selection.retarget_node(node)
    reconcile_node_store.delay(node)
    for namespace, name in sorted(changed):
        reconcile_prefetch.delay(namespace, name)
    return len(changed)


@shared_task(name=names.RECONCILE_PREFETCH, acks_late=True, **WHILE_UNREACHABLE)
def reconcile_prefetch(namespace: str, name: str) -> bool:
    written = prefetches.reconcile_prefetch(namespace, name)
    if written:  # its nodes' states moved (held, lapsed, ...): so may its artifact's Ready
        _roll_up_prefetch(namespace, name)
    return written


@shared_task(name=names.ROLLUP_DIGEST, acks_late=True, **WHILE_UNREACHABLE)
def rollup_digest(digest: str) -> int:
    written = rollup.rollup(digest)
    for namespace, name in prefetches.prefetches_of_digest(digest):
        reconcile_prefetch.delay(namespace, name)
    return written


@shared_task(name=names.RECONCILE_PLACEMENT_LABELS, acks_late=True, **WHILE_UNREACHABLE)
def reconcile_placement_labels(node: str) -> str:
    return node_labels.reconcile_placement_labels(node)


# --- Periodic (beat) -------------------------------------------------------------------------------------


@shared_task(name="gpustack_models.collect")
def collect() -> int:
    """Every ``GPUSTACK_COLLECTION_INTERVAL_SECONDS``: nodes where a grace ended or a retention ran out
    are reconciled (which drops the digests from spec.models and logs why); those whose time comes before
    the next pass are reconciled at that time."""
    now = timezone.now()
    nodes = collection.collection_pass(now, ahead=settings.COLLECTION_INTERVAL_SECONDS)
    for node, at in sorted(nodes.items()):
        if at <= now:
            reconcile_node_store.delay(node)
        else:
            sending.send_at(at, names.RECONCILE_NODE_STORE, node)
    return len(nodes)


@shared_task(name="gpustack_models.release_mount_protection", acks_late=True, **WHILE_UNREACHABLE)
def release_mount_protection(namespace: str, name: str) -> bool:
    """A mount of the artifact was released or ended: lift its protection finalizer if none remains."""
    _roll_up(namespace, name)
    return mount_checks.release_protection(namespace, name)


@shared_task(name="gpustack_models.check_mounts")
def check_mounts() -> int:
    """Every ``GPUSTACK_COLLECTION_INTERVAL_SECONDS``: mount references whose Pod is gone end (their nodes
    reconciled, their artifacts released), and artifacts protected with no mount left are released."""
    nodes, artifacts = mount_checks.check_mounts()
    for node in sorted(nodes):
        reconcile_node_store.delay(node)
    for namespace, name in sorted(artifacts | mount_checks.leftover_protections()):
        release_mount_protection.delay(namespace, name)
    return len(nodes)


@shared_task(name=names.RECORD_EVENTS, **WHILE_UNREACHABLE)
def record_events(regarding: dict, recorded: list[list[str]]) -> int:
    """Record Kubernetes Events about one object: ``[type, reason, message, series key]`` each."""
    for type_, reason, message, series_key in recorded:
        events.record(regarding, type_, reason, message, series_key=series_key)
    return len(recorded)


@shared_task(name="gpustack_models.retry_failed_resolutions")
def retry_failed_resolutions(limit: int = 500) -> int:
    """Every 30 s: artifacts whose resolution failed for a reason a person must fix, and whose backoff
    passed, are tried again (a token may have been granted access, a tag created); so are failed ones no
    row schedules yet, and those whose resolution was never done (its task lost with the broker's queue)."""
    due = retries.take_due(limit) + retries.unscheduled(limit) + retries.never_resolved(limit)
    for ns, name in due:
        resolve_artifact.delay(ns, name)
    return len(due)


@shared_task(name="gpustack_models.check_resolution_secrets")
def check_resolution_secrets() -> int:
    """Every few seconds: a failed artifact whose Secret changed since its failure is tried at once."""
    changed = retries.changed_secrets(settings.SECRET_CHECK_BATCH)
    for ns, name in changed:
        resolve_artifact.delay(ns, name)
    return len(changed)


@shared_task(name="gpustack_models.resync_node_stores")
def resync_node_stores() -> int:
    """Every minute: every node running the plugin gets its store reconciled (a safety net for lost events)."""
    nodes = set(PluginPod.objects.live().filter(ready=True).values_list("node", flat=True))
    nodes |= set(NodeStore.objects.live().values_list("name", flat=True))
    for node in sorted(n for n in nodes if n):
        reconcile_node_store.delay(node)
    for ns, name in Prefetch.objects.live().values_list("namespace", "name"):
        reconcile_prefetch.delay(ns, name)
    return len(nodes)


@shared_task(name="gpustack_models.resync_placement_labels")
def resync_placement_labels() -> int:
    """Every ``GPUSTACK_PLACEMENT_LABELS_RESYNC_SECONDS``: the nodes whose placement labels differ from
    what they hold (or, outside the node-labels mode, that still carry one) are reconciled."""
    nodes = node_labels.out_of_date()
    for node in nodes:
        reconcile_placement_labels.delay(node)
    return len(nodes)


@shared_task(name="gpustack_models.purge_tombstones")
def purge_tombstones(older_than_seconds: int = 600) -> int:
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    total = mirror.purge_tombstones(cutoff) + events.purge()
    close_old_connections()
    return total
