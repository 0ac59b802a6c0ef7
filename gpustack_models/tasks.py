"""Celery tasks. Each takes ids or small payloads and is safe to run twice, in any order.

Mirror tasks apply one informer event (or a relist batch) and then enqueue the reconcilers the change
concerns; the reconcilers read the mirror and write to Kubernetes as the worker.
"""

from __future__ import annotations

import logging
import socket

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections

from . import mirror, reconcile
from .models import Artifact, InformerState, NodeStore, PluginPod, Prefetch

log = logging.getLogger(__name__)


@shared_task(name="gpustack_models.ping", ignore_result=False)
def ping(payload: str) -> dict:
    """Answer with the payload and this worker's host: a health check of the broker round trip."""
    return {"payload": payload, "host": socket.gethostname()}


# --- The mirror ------------------------------------------------------------------------------------------


@shared_task(name="gpustack_models.mirror_event", acks_late=True)
def mirror_event(resource: str, event_type: str, obj: dict) -> bool:
    """Apply one watch event (ADDED, MODIFIED, DELETED) to the mirror."""
    kind = mirror.KINDS[resource]
    change = mirror.delete_object(kind, obj) if event_type == "DELETED" else mirror.apply_object(kind, obj)
    if change.applied:
        react(kind, change)
    return change.applied


@shared_task(name="gpustack_models.mirror_batch", acks_late=True)
def mirror_batch(resource: str, objects: list[dict]) -> int:
    """Apply the objects of a (re)list."""
    kind = mirror.KINDS[resource]
    applied = 0
    for obj in objects:
        change = mirror.apply_object(kind, obj)
        if change.applied:
            applied += 1
            react(kind, change)
    return applied


@shared_task(name="gpustack_models.mirror_prune", acks_late=True)
def mirror_prune(resource: str, keys: list[dict], list_rv: int) -> int:
    """Remove what a relist at ``list_rv`` no longer returned."""
    kind = mirror.KINDS[resource]
    removed = mirror.prune(kind, keys, list_rv)
    for body in removed:
        react(kind, mirror.Change(True, body, None))
    return len(removed)


def react(kind: mirror.Kind, change: mirror.Change) -> None:
    """Enqueue what a mirrored change concerns."""
    before, after = change.before, change.after
    body = after or before or {}
    meta = body.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    if kind is mirror.ARTIFACTS:
        if after is not None and reconcile.needs_resolution(after):
            resolve_artifact.delay(namespace, name)
        old_digest = ((before or {}).get("status") or {}).get("resolved", {}).get("manifestDigest", "")
        new_digest = ((after or {}).get("status") or {}).get("resolved", {}).get("manifestDigest", "")
        if old_digest != new_digest or after is None:
            for prefetch in Prefetch.objects.live().filter(namespace=namespace, artifact_name=name):
                reconcile_prefetch.delay(namespace, prefetch.name)
            if new_digest:
                rollup_digest.delay(new_digest)
    elif kind is mirror.PREFETCHES:
        nodes = set(reconcile.prefetch_nodes(before)) | set(reconcile.prefetch_nodes(after))
        for node in sorted(nodes):
            reconcile_node_store.delay(node)
        if after is not None:
            reconcile_prefetch.delay(namespace, name)
    elif kind is mirror.STORES:
        if after is None or (before or {}).get("spec") != after.get("spec"):
            reconcile_node_store.delay(name)
        old, new = mirror.entries_of(before), mirror.entries_of(after)
        changed = {d for d in set(old) | set(new) if old.get(d) != new.get(d)}
        for digest in sorted(changed):
            rollup_digest.delay(digest)
    elif kind is mirror.NODES:
        reconcile_node_store.delay(name)
    elif kind is mirror.PODS:
        for node in {(before or {}).get("spec", {}).get("nodeName"), (after or {}).get("spec", {}).get("nodeName")}:
            if node:
                reconcile_node_store.delay(node)


@shared_task(name="gpustack_models.record_informer")
def record_informer(resource: str, resource_version: str, relisted: bool, expired: bool) -> None:
    state, _ = InformerState.objects.get_or_create(resource=resource)
    state.resource_version = resource_version
    state.relists += int(relisted)
    state.expired += int(expired)
    state.save()


# --- Reconcilers -----------------------------------------------------------------------------------------


@shared_task(name="gpustack_models.resolve_artifact", bind=True, acks_late=True, max_retries=None)
def resolve_artifact(self, namespace: str, name: str) -> str:
    """Resolve an artifact's source to a commit and manifest digest and write its status.

    Temporary failures (hub unavailable, Secret or claim missing) retry with backoff; they never remove
    an earlier resolution."""
    outcome = reconcile.resolve(namespace, name)
    if outcome.retry:
        countdown = min(settings.RESOLVE_RETRY_MAX, settings.RESOLVE_RETRY_BASE * (2**self.request.retries))
        if outcome.retry_after:
            countdown = max(countdown, min(outcome.retry_after, settings.RESOLVE_RETRY_MAX))
        raise self.retry(countdown=countdown)
    return outcome.reason


@shared_task(name="gpustack_models.reconcile_node_store", acks_late=True)
def reconcile_node_store(node: str) -> str:
    return reconcile.node_store(node)


@shared_task(name="gpustack_models.reconcile_prefetch", acks_late=True)
def reconcile_prefetch(namespace: str, name: str) -> bool:
    return reconcile.prefetch_status(namespace, name)


@shared_task(name="gpustack_models.rollup_digest", acks_late=True)
def rollup_digest(digest: str) -> int:
    written = reconcile.rollup(digest)
    for prefetch in reconcile.prefetches_of_digest(digest):
        reconcile_prefetch.delay(prefetch.namespace, prefetch.name)
    return written


# --- Periodic (beat) -------------------------------------------------------------------------------------


@shared_task(name="gpustack_models.revalidate_unresolved")
def revalidate_unresolved(limit: int = 500) -> int:
    """Every few minutes: artifacts whose resolution failed for good are tried again (a token may have
    been granted access, a tag created)."""
    count = 0
    for ns, name in (
        Artifact.objects.live()
        .exclude(resolved_status="True")
        .exclude(source="")
        .values_list("namespace", "name")[:limit]
    ):
        resolve_artifact.delay(ns, name)
        count += 1
    return count


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


@shared_task(name="gpustack_models.purge_tombstones")
def purge_tombstones(older_than_seconds: int = 600) -> int:
    from datetime import timedelta

    from django.utils import timezone

    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    total = 0
    for kind in mirror.KINDS.values():
        total += kind.model.objects.filter(deleted=True, updated_at__lt=cutoff).delete()[0]
    close_old_connections()
    return total
