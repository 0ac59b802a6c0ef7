"""Applying a batch of watch events to the mirror in a few statements, not a few per event.

The rows of every object in the batch are locked with one ``SELECT ... FOR UPDATE`` (in key order, so two
batches never wait on each other in a cycle), each event is applied in memory with exactly the guards of
``mirror.apply_object`` / ``mirror.delete_object`` (a stale or duplicate event changes nothing, a deletion
leaves a tombstone), then the new rows are inserted with one ``INSERT`` and the changed ones written with one
``INSERT ... ON CONFLICT DO UPDATE``; a NodeModelStore's entry rows follow its status the same way, for all
stores of the batch at once.
A row another task created meanwhile (a unique key taken) rolls the batch back and applies it event by event,
each under its own guard, as before.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import reduce
from operator import or_

from django.db import IntegrityError, models, transaction
from django.utils import timezone

from gpustack_models.informers import mirror
from gpustack_models.informers.mirror import Change, Kind
from gpustack_models.models import StoreEntry

_ENTRY_FIELDS = list(mirror._entry_values({}).keys())


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
        "resource_version": mirror.rv_of(obj),
        "uid": (obj.get("metadata") or {}).get("uid", ""),
        "deleted": False,
        "body": mirror.trimmed(obj),
        **kind.fields(obj),
    }


def _upsert(batch: _Rows, key: tuple, obj: dict) -> Change:
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
    row, rv = batch.rows.get(key), mirror.rv_of(obj)
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
    if kind is mirror.STORES:
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
    return {
        e["digest"]: mirror._entry_values(e) for e in (obj.get("status") or {}).get("models") or [] if e.get("digest")
    }


def apply_events(kind: Kind, events: list[tuple[str, dict]]) -> list[Change]:
    """Apply a batch of events (each object's in its order) in one transaction; the changes in the events'
    order."""
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
    except IntegrityError:  # a row created meanwhile by another task: one by one, each under its lock
        return mirror.apply_events(kind, events)
