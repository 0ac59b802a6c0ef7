"""Writing the mirror from Kubernetes objects, safely under repeated and reordered delivery.

``apply_object`` is a conditional ``UPDATE ... WHERE resource_version < new`` (falling back to an
``INSERT`` when the row does not exist yet): a stale event changes nothing, a duplicate changes nothing,
and two tasks racing on one row serialise on the row lock with the newer one winning. Deletions leave
tombstones with the deletion's resourceVersion. ``prune`` removes what a relist no longer returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, models, transaction

from gpustack_models.kinds import GROUP
from gpustack_models.kinds.formatting import parse_duration, parse_time
from gpustack_models.models import Artifact, Namespace, Node, NodeStore, PluginPod, Prefetch, StoreEntry
from gpustack_models.reconcilers.writes import find_condition

log = logging.getLogger(__name__)


def rv_of(obj: dict) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:  # resourceVersion is opaque; kube-apiserver's are integers
        return 0


def trimmed(obj: dict) -> dict:
    """The object without managedFields (the mirror never needs them; they are most of an object)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj


# --- Per kind: the row's key and columns from an object ------------------------------------------------


def _artifact_fields(obj: dict) -> dict:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    source = spec.get("source") or {}
    kind = next((k for k in ("huggingFace", "modelScope", "persistentVolumeClaim") if k in source), "")
    member = source.get(kind) or {}
    resolved = status.get("resolved") or {}
    cond = find_condition(obj, "Resolved")
    return {
        "generation": (obj.get("metadata") or {}).get("generation") or 0,
        "source": kind,
        "repository": member.get("repository") or member.get("claimName") or "",
        "revision": member.get("revision") or member.get("path") or "",
        "digest": resolved.get("manifestDigest") or "",
        "resolved_revision": resolved.get("revision") or "",
        "size_bytes": resolved.get("sizeBytes"),
        "file_count": resolved.get("fileCount"),
        "resolved_status": cond.get("status", ""),
        "resolved_reason": cond.get("reason", ""),
        "nodes": status.get("nodes") or {},
    }


def _store_fields(obj: dict) -> dict:
    capacity = (obj.get("status") or {}).get("capacity") or {}
    return {
        "spec_models": (obj.get("spec") or {}).get("models") or [],
        "total_bytes": capacity.get("totalBytes") or 0,
        "stored_bytes": capacity.get("storedBytes") or 0,
        "used_percent": capacity.get("usedPercent") or 0,
    }


def _prefetch_fields(obj: dict) -> dict:
    spec = obj.get("spec") or {}
    retention = spec.get("retention") or {}
    return {
        "artifact_name": (spec.get("artifactRef") or {}).get("name", ""),
        "node_names": spec.get("nodeNames") or [],
        "node_selector": spec.get("nodeSelector"),
        "pinned": bool(retention.get("pinned")),
        "ttl_seconds": parse_duration(retention.get("ttlAfterLastUse")),
        "min_ready": spec.get("minReady") or 0,
        "created_at": _time((obj.get("metadata") or {}).get("creationTimestamp")),
        "status": obj.get("status") or {},
    }


PREFETCH_BYTES_ANNOTATION = f"{GROUP}/prefetch-bytes-per-node"


def _namespace_fields(obj: dict) -> dict:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(PREFETCH_BYTES_ANNOTATION)
    try:
        limit = int(value) if value is not None else None
    except ValueError:
        log.warning("namespace %s: ignoring %s=%r: not a number of bytes", obj["metadata"].get("name"),
                    PREFETCH_BYTES_ANNOTATION, value)  # fmt: skip
        limit = None
    return {"prefetch_bytes_per_node": limit if limit is None or limit >= 0 else None}


def _node_fields(obj: dict) -> dict:
    return {"labels": (obj.get("metadata") or {}).get("labels") or {}}


def _pod_fields(obj: dict) -> dict:
    status = obj.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return {
        "node": (obj.get("spec") or {}).get("nodeName") or "",
        "pod_ip": status.get("podIP") or "",
        "ready": ready
        and status.get("phase") == "Running"
        and not (obj.get("metadata") or {}).get("deletionTimestamp"),
    }


@dataclass(frozen=True)
class Kind:
    """How one mirrored resource maps onto its model."""

    resource: str
    model: type[models.Model]
    namespaced: bool
    fields: Callable[[dict], dict]

    def key(self, obj: dict) -> dict:
        metadata = obj.get("metadata") or {}
        key = {"name": metadata.get("name", "")}
        if self.namespaced:
            key["namespace"] = metadata.get("namespace", "")
        return key


ARTIFACTS = Kind("modelartifacts", Artifact, True, _artifact_fields)
STORES = Kind("nodemodelstores", NodeStore, False, _store_fields)
PREFETCHES = Kind("modelprefetches", Prefetch, True, _prefetch_fields)
NODES = Kind("nodes", Node, False, _node_fields)
PODS = Kind("pods", PluginPod, True, _pod_fields)
NAMESPACES = Kind("namespaces", Namespace, False, _namespace_fields)
KINDS = {k.resource: k for k in (ARTIFACTS, STORES, PREFETCHES, NODES, PODS, NAMESPACES)}


# --- Writes ----------------------------------------------------------------------------------------------


@dataclass
class Change:
    """What a write did: ``applied`` is False for a stale or duplicate event."""

    applied: bool
    before: dict | None = None  # the row's body before the write (None: no live row)
    after: dict | None = None


def apply_object(kind: Kind, obj: dict) -> Change:
    """Upsert ``obj`` unless the mirror already holds its resourceVersion or a newer one."""
    rv, key = rv_of(obj), kind.key(obj)
    body = trimmed(obj)
    values = {
        "resource_version": rv,
        "uid": (obj.get("metadata") or {}).get("uid", ""),
        "deleted": False,
        "body": body,
        **kind.fields(obj),
    }
    with transaction.atomic():
        current = kind.model.objects.select_for_update().filter(**key).first()
        if current is None:
            try:
                with transaction.atomic():
                    row = kind.model.objects.create(**key, **values)
            except IntegrityError:  # created meanwhile by a task for the same object: take its lock
                return apply_object(kind, obj)
            if kind is STORES:
                _sync_entries(row, obj)
            return Change(True, None, body)
        if current.resource_version >= rv:
            return Change(False)
        before = None if current.deleted else current.body
        for field, value in values.items():
            setattr(current, field, value)
        current.save()
        if kind is STORES:
            _sync_entries(current, obj)
        return Change(True, before, body)


def delete_object(kind: Kind, obj: dict) -> Change:
    """Tombstone the row unless something newer is already mirrored."""
    rv, key = rv_of(obj), kind.key(obj)
    with transaction.atomic():
        current = kind.model.objects.select_for_update().filter(**key).first()
        if current is None:
            try:
                with transaction.atomic():
                    kind.model.objects.create(
                        **key, resource_version=rv, deleted=True, body=trimmed(obj), **kind.fields(obj)
                    )
            except IntegrityError:
                return delete_object(kind, obj)
            return Change(False)
        if current.resource_version > rv or current.deleted:
            return Change(False)
        before = current.body
        current.resource_version, current.deleted = rv, True
        current.save(update_fields=["resource_version", "deleted", "updated_at"])
        if kind is STORES:
            current.entries.all().delete()
        return Change(True, before, None)


def apply_event(kind: Kind, event_type: str, obj: dict) -> Change:
    """One watch event: DELETED tombstones, anything else upserts."""
    return delete_object(kind, obj) if event_type == "DELETED" else apply_object(kind, obj)


def apply_events(kind: Kind, events: list[tuple[str, dict]]) -> list[Change]:
    """Apply a batch of events in one transaction, with each row's guards as one by one (the changes in
    the events' order).

    The rows are locked in the order of their keys (an object's events in their own order), so two
    batches running at once never wait on each other in a cycle."""

    def lock_order(i: int):
        key = kind.key(events[i][1])
        return key.get("namespace", ""), key["name"], i

    changes: list[Change | None] = [None] * len(events)
    with transaction.atomic():
        for i in sorted(range(len(events)), key=lock_order):
            changes[i] = apply_event(kind, *events[i])
    return changes


def prune(kind: Kind, keys: list[dict], list_rv: int) -> list[dict]:
    """Tombstone live rows a relist at ``list_rv`` did not return (rows written after it stay).

    Returns the bodies of the rows removed. Every live row is compared (a pass over the table by design),
    reading its key only: a body is read for the rows removed."""
    seen = {tuple(sorted(k.items())) for k in keys}
    columns = ("pk", "name", "namespace") if kind.namespaced else ("pk", "name")
    candidates = kind.model.objects.live().filter(resource_version__lte=list_rv).values_list(*columns)
    gone = [pk for pk, *key in candidates.iterator() if tuple(sorted(zip(columns[1:], key))) not in seen]
    removed = []
    for pk in gone:
        with transaction.atomic():
            row = kind.model.objects.select_for_update().filter(pk=pk, resource_version__lte=list_rv, deleted=False)
            body = row.values_list("body", flat=True).first()
            if body is None:
                continue  # written or removed meanwhile
            row.update(deleted=True, resource_version=list_rv)
            if kind is STORES:
                StoreEntry.objects.filter(store_id=pk).delete()
        removed.append(body)
    return removed


def purge_tombstones(cutoff: datetime) -> int:
    """Remove the tombstones written before ``cutoff`` (of every kind); how many rows went."""
    return sum(kind.model.objects.filter(deleted=True, updated_at__lt=cutoff).delete()[0] for kind in KINDS.values())


def _entry_values(entry: dict) -> dict:
    return {
        "state": entry.get("state") or "",
        "size_bytes": entry.get("sizeBytes") or 0,
        "downloaded_bytes": entry.get("downloadedBytes") or 0,
        "reason": entry.get("reason") or "",
        "message": entry.get("message") or "",
        "retry_time": _time(entry.get("retryTime")),
        "last_used_time": _time(entry.get("lastUsedTime")),
        "source": entry.get("source") or "",
        "pinned": bool(entry.get("pinned")),
        "collect_time": _time(entry.get("collectTime")),
    }


def _time(value) -> datetime | None:
    try:
        return parse_time(value)
    except ValueError:
        return None


def _sync_entries(store: NodeStore, obj: dict) -> None:
    """Make the store's entry rows equal to its status.models (inside the store row's lock)."""
    wanted = {}
    for entry in (obj.get("status") or {}).get("models") or []:
        if entry.get("digest"):
            wanted[entry["digest"]] = _entry_values(entry)
    existing = {e.digest: e for e in store.entries.all()}
    stale = [e.pk for d, e in existing.items() if d not in wanted]
    if stale:
        StoreEntry.objects.filter(pk__in=stale).delete()
    for digest, values in wanted.items():
        row = existing.get(digest)
        if row is None:
            StoreEntry.objects.create(store=store, node=store.name, digest=digest, **values)
        elif any(getattr(row, f) != v for f, v in values.items()):
            for f, v in values.items():
                setattr(row, f, v)
            row.save()


def entries_of(body: dict | None) -> dict[str, dict]:
    """digest -> status entry of a NodeModelStore body."""
    if not body:
        return {}
    return {e.get("digest"): e for e in ((body.get("status") or {}).get("models") or []) if e.get("digest")}
