"""What a change of the mirror concerns: the reconcilers a mirrored change enqueues, per kind.

Each takes the row's body before and after the change (``None``: no live object) and enqueues
idempotent tasks by name and key; running one twice, or after a later change, is harmless.
"""

from __future__ import annotations

from gpustack_models.models import Prefetch

from . import mirror, retries, store_events
from .node_stores import prefetch_nodes
from .resolution import needs_resolution


def _tasks():
    from gpustack_models import tasks  # tasks import this module

    return tasks


def _resolved_digest(body: dict | None) -> str:
    return ((body or {}).get("status") or {}).get("resolved", {}).get("manifestDigest", "")


def artifact_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    tasks = _tasks()
    if after is not None and retries.take_request(after):  # worker.gpustack.ai/requested-at took a new value
        tasks.resolve_artifact.delay(namespace, name, force=True)
    elif after is not None and needs_resolution(after):
        tasks.resolve_artifact.delay(namespace, name)
    old_digest, new_digest = _resolved_digest(before), _resolved_digest(after)
    if old_digest == new_digest and after is not None:
        return
    for prefetch in Prefetch.objects.live().filter(namespace=namespace, artifact_name=name):
        tasks.reconcile_prefetch.delay(namespace, prefetch.name)
    if new_digest:
        tasks.rollup_digest.delay(new_digest)


def prefetch_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    tasks = _tasks()
    for node in sorted(set(prefetch_nodes(before)) | set(prefetch_nodes(after))):
        tasks.reconcile_node_store.delay(node)
    if after is not None:
        tasks.reconcile_prefetch.delay(namespace, name)


def store_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    tasks = _tasks()
    if after is None or (before or {}).get("spec") != after.get("spec"):
        tasks.reconcile_node_store.delay(name)
    old, new = mirror.entries_of(before), mirror.entries_of(after)
    for digest in sorted(d for d in set(old) | set(new) if old.get(d) != new.get(d)):
        tasks.rollup_digest.delay(digest)
    store_events.store_changed(before, after)


def node_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    _tasks().reconcile_node_store.delay(name)


def plugin_pod_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    nodes = {(body or {}).get("spec", {}).get("nodeName") for body in (before, after)}
    for node in sorted(n for n in nodes if n):
        _tasks().reconcile_node_store.delay(node)


REACTIONS = {
    mirror.ARTIFACTS.resource: artifact_changed,
    mirror.PREFETCHES.resource: prefetch_changed,
    mirror.STORES.resource: store_changed,
    mirror.NODES.resource: node_changed,
    mirror.PODS.resource: plugin_pod_changed,
}


def react(kind: mirror.Kind, change: mirror.Change) -> None:
    """Enqueue what a mirrored change concerns."""
    body = change.after or change.before or {}
    meta = body.get("metadata") or {}
    REACTIONS[kind.resource](change.before, change.after, meta.get("namespace", ""), meta.get("name", ""))
