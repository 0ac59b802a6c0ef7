"""Writing the mirror from Kubernetes objects, safely under repeated and reordered delivery, on one path.

``apply_events`` applies a batch of watch events (a relist's page, a coalesced batch, or one event: a batch
of one) in one transaction and a few statements, not a few per event. The rows of every object in the
batch are locked with one ``SELECT ... FOR UPDATE`` (in key order, so two batches never wait on each other
in a cycle); each event is applied in memory under its row's resourceVersion guard (a stale or duplicate
event changes nothing, two tasks racing on one row serialise on its lock with the newer one winning, a
deletion leaves a tombstone with the deletion's resourceVersion); then the new rows are inserted with one
``INSERT`` and the changed ones written with one ``INSERT ... ON CONFLICT DO UPDATE``; a NodeModelStore's
entry rows follow its status the same way, for all stores of the batch at once. A row another task created
meanwhile (a unique key taken) rolls the batch back, and the batch runs again with that row locked too.
``prune`` removes what a relist no longer returned.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce
from operator import or_

from django.db import IntegrityError, models, transaction
from django.utils import timezone

from gpustack_models.kinds import GROUP, nodemodelstore
from gpustack_models.kinds.formatting import parse_duration, parse_time
from gpustack_models.models import Artifact, Namespace, Node, NodeStore, PluginPod, Prefetch, StoreEntry

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
    kind = next((k for k in ("huggingFace", "modelScope", "oci", "s3", "persistentVolumeClaim") if k in source), "")
    member = source.get(kind) or {}
    if kind == "s3":
        member = {"repository": f"{member.get('bucket', '')}/{member.get('prefix') or ''}".rstrip("/")}
    resolved = status.get("resolved") or {}
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Resolved"), {})
    return {
        "generation": (obj.get("metadata") or {}).get("generation") or 0,
        "source": kind,
        "repository": member.get("repository") or member.get("reference") or member.get("claimName") or "",
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


@dataclass
class _Rows:
    """The batch's rows by key: those locked in the database and those it creates."""

    kind: Kind
    rows: dict[tuple, models.Model]
    new: set[tuple] = field(default_factory=set)
    dirty: set[tuple] = field(default_factory=set)
    stores: dict[tuple, dict | None] = field(default_factory=dict)  # store key -> its latest object (None: gone)
    names: list[str] = field(default_factory=list)  # the columns an upsert writes


def _key(kind: Kind, obj: dict) -> tuple:
    key = kind.key(obj)
    return key.get("namespace", ""), key["name"]


def _lock(kind: Kind, keys: set[tuple]) -> dict[tuple, models.Model]:
    if kind.namespaced:
        names = defaultdict(set)
        for namespace, name in keys:
            names[namespace].add(name)
        where = reduce(or_, (models.Q(namespace=ns, name__in=sorted(n)) for ns, n in names.items()))
        order = ("namespace", "name")
    else:
        where, order = models.Q(name__in=sorted(name for _, name in keys)), ("name",)
    rows = kind.model.objects.select_for_update().filter(where).order_by(*order)
    return {(getattr(r, "namespace", "") if kind.namespaced else "", r.name): r for r in rows}


def _values(kind: Kind, obj: dict) -> dict:
    return {
        "resource_version": rv_of(obj),
        "uid": (obj.get("metadata") or {}).get("uid", ""),
        "deleted": False,
        "body": trimmed(obj),
        **kind.fields(obj),
    }


def _upsert(batch: _Rows, key: tuple, obj: dict) -> Change:
    """An object's state, unless the row already holds its resourceVersion or a newer one."""
    kind, row, values = batch.kind, batch.rows.get(key), _values(batch.kind, obj)
    batch.names = batch.names or [*values, "updated_at"]
    if row is None:
        ids = {"name": key[1], **({"namespace": key[0]} if kind.namespaced else {})}
        batch.rows[key] = kind.model(**ids, **values)
        batch.new.add(key)
    elif row.resource_version >= values["resource_version"]:
        return Change(False)
    else:
        before = None if row.deleted else row.body
        for name, value in values.items():
            setattr(row, name, value)
        batch.dirty.add(key)
        batch.stores[key] = obj
        return Change(True, before, values["body"])
    batch.stores[key] = obj
    return Change(True, None, values["body"])


def _tombstone(batch: _Rows, key: tuple, obj: dict) -> Change:
    """A deletion: the row becomes a tombstone unless something newer is already mirrored."""
    row, rv = batch.rows.get(key), rv_of(obj)
    if row is None:
        _upsert(batch, key, obj)
        batch.rows[key].deleted = True
        batch.stores[key] = None
        return Change(False)
    if row.resource_version > rv or row.deleted:
        return Change(False)
    before = row.body
    row.resource_version, row.deleted = rv, True
    batch.dirty.add(key)
    batch.stores[key] = None
    return Change(True, before, None)


def _write(batch: _Rows) -> None:
    kind, now = batch.kind, timezone.now()
    created = [batch.rows[k] for k in sorted(batch.new)]
    updated = [batch.rows[k] for k in sorted(batch.dirty - batch.new)]
    for row in created + updated:
        row.updated_at = now
    if created:
        kind.model.objects.bulk_create(created)
    if updated:
        _update(kind.model, updated, batch.names or ["resource_version", "deleted", "updated_at"])
    if kind is STORES:
        _sync_entries({batch.rows[k]: obj for k, obj in batch.stores.items()})


def _update(model: type[models.Model], rows: list[models.Model], names: list[str]) -> None:
    """Write ``names`` of rows that exist (and are locked) in one statement: an ``INSERT ... ON CONFLICT (id)
    DO UPDATE`` (Django's ``bulk_update`` compiles a ``CASE`` per row and column, slower than a save per row)."""
    if rows:
        model.objects.bulk_create(rows, update_conflicts=True, unique_fields=["id"], update_fields=names)


def _sync_entries(stores: dict) -> None:
    """Make each store's entry rows equal to its object's status.models (none for a store gone)."""
    existing = defaultdict(dict)
    for entry in StoreEntry.objects.filter(store_id__in=[s.pk for s in stores]):
        existing[entry.store_id][entry.digest] = entry
    stale, create, update = [], [], []
    for store, obj in stores.items():
        wanted = {} if obj is None else _wanted(obj)
        have = existing[store.pk]
        stale.extend(e.pk for d, e in have.items() if d not in wanted)
        for digest, values in wanted.items():
            row = have.get(digest)
            if row is None:
                create.append(StoreEntry(store=store, node=store.name, digest=digest, **values))
            elif any(getattr(row, f) != v for f, v in values.items()):
                for f, v in values.items():
                    setattr(row, f, v)
                update.append(row)
    if stale:
        StoreEntry.objects.filter(pk__in=stale).delete()
    StoreEntry.objects.bulk_create(create)
    _update(StoreEntry, update, _ENTRY_FIELDS)


def _wanted(obj: dict) -> dict[str, dict]:
    return {e["digest"]: _entry_values(e) for e in (obj.get("status") or {}).get("models") or [] if e.get("digest")}


def apply_events(kind: Kind, events: list[tuple[str, dict]]) -> list[Change]:
    """Apply a batch of events (each object's in its order: DELETED tombstones, anything else upserts) in one
    transaction; the changes in the events' order."""
    if not events:
        return []
    try:
        with transaction.atomic():
            keys = [_key(kind, obj) for _, obj in events]
            batch = _Rows(kind, _lock(kind, set(keys)))
            changes = [
                (_tombstone if type_ == "DELETED" else _upsert)(batch, key, obj)
                for (type_, obj), key in zip(events, keys, strict=True)
            ]
            _write(batch)
            return changes
    except IntegrityError:  # a row created meanwhile by another task: again, with that row locked too
        return apply_events(kind, events)


def apply_event(kind: Kind, event_type: str, obj: dict) -> Change:
    """One watch event: a batch of one."""
    return apply_events(kind, [(event_type, obj)])[0]


def apply_object(kind: Kind, obj: dict) -> Change:
    """Upsert ``obj`` unless the mirror already holds its resourceVersion or a newer one (a batch of one)."""
    return apply_event(kind, "ADDED", obj)


def delete_object(kind: Kind, obj: dict) -> Change:
    """Tombstone the row unless something newer is already mirrored (a batch of one)."""
    return apply_event(kind, "DELETED", obj)


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
    """An entry's columns. ``reason`` is one of the fixed failure reasons on a ``Failed`` entry (the schema
    admits no other; one written before it did reads ``Unknown``) and empty on any other."""
    state = entry.get("state") or ""
    return {
        "state": state,
        "size_bytes": entry.get("sizeBytes") or 0,
        "downloaded_bytes": entry.get("downloadedBytes") or 0,
        "reason": nodemodelstore.failure_reason(entry.get("reason")) if state == nodemodelstore.FAILED else "",
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


_ENTRY_FIELDS = list(_entry_values({}).keys())


def entries_of(body: dict | None) -> dict[str, dict]:
    """digest -> status entry of a NodeModelStore body."""
    if not body:
        return {}
    return {e.get("digest"): e for e in ((body.get("status") or {}).get("models") or []) if e.get("digest")}


def spec_digests(body: dict | None) -> set[str]:
    """The digests of a NodeModelStore body's spec.models."""
    models = ((body or {}).get("spec") or {}).get("models") or []
    return {m["digest"] for m in models if isinstance(m, dict) and isinstance(m.get("digest"), str)}
