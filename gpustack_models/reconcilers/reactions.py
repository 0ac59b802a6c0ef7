"""What a change of the mirror concerns: the reconcilers a mirrored change enqueues, per kind.

Each takes the row's body before and after the change (``None``: no live object) and enqueues
idempotent tasks by name and key; running one twice, or after a later change, is harmless. Within
``once_per_key()`` (a batch of mirrored changes) each task is enqueued once per arguments, when the
block ends: one roll-up per digest and one reconcile per node for a whole batch.
"""

from __future__ import annotations

import contextlib
import contextvars

from gpustack_models.informers import mirror
from gpustack_models.models import Prefetch, PrefetchTarget
from gpustack_models.reconcilers import retries, store_events
from gpustack_models.reconcilers.resolution import needs_resolution


def _tasks():
    from gpustack_models.reconcilers import tasks

    return tasks


_pending: contextvars.ContextVar[dict | None] = contextvars.ContextVar("pending_reactions", default=None)


def _enqueue(task, *args, **kwargs) -> None:
    pending = _pending.get()
    if pending is None:
        task.delay(*args, **kwargs)
    else:
        pending.setdefault((task.name, args, tuple(sorted(kwargs.items()))), (task, args, kwargs))


@contextlib.contextmanager
def once_per_key():
    """Collect the reactions enqueued inside the block and enqueue each distinct one once at its end;
    yields the list that then holds ``[task name, args, kwargs]`` of each."""
    sent: list[list] = []
    token = _pending.set({})
    try:
        yield sent
    finally:
        pending = _pending.get()
        _pending.reset(token)
        for task, args, kwargs in pending.values():
            task.delay(*args, **kwargs)
            sent.append([task.name, list(args), kwargs])


def _resolved_digest(body: dict | None) -> str:
    return ((body or {}).get("status") or {}).get("resolved", {}).get("manifestDigest", "")


def artifact_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    tasks = _tasks()
    if after is not None and retries.take_request(after):  # worker.gpustack.ai/requested-at took a new value
        _enqueue(tasks.resolve_artifact, namespace, name, force=True)
    elif after is not None and needs_resolution(after):
        _enqueue(tasks.resolve_artifact, namespace, name)
    old_digest, new_digest = _resolved_digest(before), _resolved_digest(after)
    if old_digest == new_digest and after is not None:
        return
    for prefetch in Prefetch.objects.live().filter(namespace=namespace, artifact_name=name):
        _enqueue(tasks.reconcile_prefetch, namespace, prefetch.name)
    # The digest its prefetches place changed (resolved, or gone): their nodes' spec.models with it.
    targets = PrefetchTarget.objects.filter(prefetch__namespace=namespace, prefetch__artifact_name=name)
    for node in sorted(set(targets.values_list("node", flat=True))):
        _enqueue(tasks.reconcile_node_store, node)
    if new_digest:
        _enqueue(tasks.rollup_digest, new_digest)


def prefetch_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A new, changed or deleted spec retargets the prefetch (which reconciles its nodes); a status
    written by the worker itself concerns nobody."""
    if before is not None and after is not None and before.get("spec") == after.get("spec"):
        return
    _enqueue(_tasks().retarget_prefetch, namespace, name)


def store_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    tasks = _tasks()
    if after is None or (before or {}).get("spec") != after.get("spec"):
        _enqueue(tasks.reconcile_node_store, name)
    old, new = mirror.entries_of(before), mirror.entries_of(after)
    for digest in sorted(d for d in set(old) | set(new) if old.get(d) != new.get(d)):
        _enqueue(tasks.rollup_digest, digest)
    store_events.store_changed(before, after)


def _labels(body: dict | None) -> dict | None:
    return None if body is None else (body.get("metadata") or {}).get("labels") or {}


def node_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A node that appears, goes or changes labels is re-evaluated against every label selector."""
    if _labels(before) != _labels(after):
        _enqueue(_tasks().retarget_node, name)
    else:
        _enqueue(_tasks().reconcile_node_store, name)


def plugin_pod_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A plugin that starts or stops on a node makes the node selectable, or not."""
    nodes = {(body or {}).get("spec", {}).get("nodeName") for body in (before, after)}
    for node in sorted(n for n in nodes if n):
        _enqueue(_tasks().retarget_node, node)


def namespace_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A namespace's byte limit per node changed: the nodes its prefetches target are placed again."""
    limit = mirror.PREFETCH_BYTES_ANNOTATION
    old, new = (((b or {}).get("metadata") or {}).get("annotations") or {} for b in (before, after))
    if old.get(limit) == new.get(limit):
        return
    nodes = PrefetchTarget.objects.filter(prefetch__namespace=name).values_list("node", flat=True)
    for node in sorted(set(nodes)):
        _enqueue(_tasks().reconcile_node_store, node)


REACTIONS = {
    mirror.ARTIFACTS.resource: artifact_changed,
    mirror.PREFETCHES.resource: prefetch_changed,
    mirror.STORES.resource: store_changed,
    mirror.NODES.resource: node_changed,
    mirror.PODS.resource: plugin_pod_changed,
    mirror.NAMESPACES.resource: namespace_changed,
}


def react(kind: mirror.Kind, change: mirror.Change) -> None:
    """Enqueue what a mirrored change concerns."""
    body = change.after or change.before or {}
    meta = body.get("metadata") or {}
    REACTIONS[kind.resource](change.before, change.after, meta.get("namespace", ""), meta.get("name", ""))
