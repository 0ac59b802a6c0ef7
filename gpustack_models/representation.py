"""What the public v1 API sends: objects at v1, Tables, PartialObjectMetadata(List).

The storage objects are ``worker.gpustack.ai/v1alpha1``; the public version is ``v1``. The schemas are the
same, so conversion is the apiVersion: of the object, of list items, of watch events, of managedFields
entries and ownerReferences, and inside kubectl's last-applied annotation (server-side apply keeps it in
step with what it received, which is the storage version).

Answers from kube-apiserver are rewritten as bytes, without decoding them: its JSON encoder writes the
pair ``"apiVersion":"worker.gpustack.ai/v1alpha1"`` only where a key ``apiVersion`` holds exactly that value,
and in this group's schemas that is always an API version (labels cannot hold a ``/``). The one text that
would be rewritten too is an annotation whose key is ``apiVersion`` with that exact value. Tables decode
only what their cells need; metadata travels as raw JSON.
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from .resources.formatting import human_duration, parse_time
from .resources.kinds import GROUP, PUBLIC_VERSION, STORAGE_VERSION, ResourceKind

PUBLIC = f"{GROUP}/{PUBLIC_VERSION}"
STORAGE = f"{GROUP}/{STORAGE_VERSION}"
META = "meta.k8s.io/v1"

# (storage form, public form): compact, indented (?pretty=true) and escaped inside a JSON string.
_PAIRS = [
    (f'"apiVersion":"{STORAGE}"'.encode(), f'"apiVersion":"{PUBLIC}"'.encode()),
    (f'"apiVersion": "{STORAGE}"'.encode(), f'"apiVersion": "{PUBLIC}"'.encode()),
    (f'\\"apiVersion\\":\\"{STORAGE}\\"'.encode(), f'\\"apiVersion\\":\\"{PUBLIC}\\"'.encode()),
]


def public_bytes(data: bytes) -> bytes:
    """Storage JSON from kube-apiserver (object, list, watch event) as v1 JSON."""
    for storage, public in _PAIRS:
        if storage in data:
            data = data.replace(storage, public)
    return data


def _swap(obj: dict, source: str, target: str) -> dict:
    if obj.get("apiVersion") == source:
        obj["apiVersion"] = target
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        for key in ("managedFields", "ownerReferences"):
            entries = metadata.get(key)
            for entry in entries if isinstance(entries, list) else ():
                if isinstance(entry, dict) and entry.get("apiVersion") == source:
                    entry["apiVersion"] = target
        annotations = metadata.get("annotations")
        last_applied = "kubectl.kubernetes.io/last-applied-configuration"
        if isinstance(annotations, dict) and isinstance(annotations.get(last_applied), str):
            annotations[last_applied] = annotations[last_applied].replace(
                f'"apiVersion":"{source}"', f'"apiVersion":"{target}"', 1
            )
    return obj


def to_storage(obj: dict) -> dict:
    """Rewrite a v1 request body (in place) to the storage version."""
    return _swap(obj, PUBLIC, STORAGE)


# --- Decoding just what Tables and PartialObjectMetadata need ----------------------------------------


class _Head(msgspec.Struct):
    name: str = ""
    creationTimestamp: str = ""
    resourceVersion: str = ""
    annotations: dict = {}


class _Item(msgspec.Struct):
    metadata: msgspec.Raw = msgspec.Raw(b"{}")
    spec: dict = {}
    status: dict = {}


class _List(msgspec.Struct):
    metadata: dict = {}
    items: list[_Item] = []


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


_decode_list = msgspec.json.Decoder(_List).decode
_decode_item = msgspec.json.Decoder(_Item).decode
_decode_head = msgspec.json.Decoder(_Head).decode
_decode_event = msgspec.json.Decoder(_Event).decode
_encode = msgspec.json.Encoder().encode


def _partial(metadata: msgspec.Raw) -> dict:
    return {"kind": "PartialObjectMetadata", "apiVersion": META, "metadata": msgspec.Raw(public_bytes(bytes(metadata)))}


def partial_bytes(data: bytes) -> bytes:
    return _encode(_partial(_decode_item(data).metadata))


def partial_list_bytes(data: bytes) -> bytes:
    lst = _decode_list(data)
    return _encode(
        {
            "kind": "PartialObjectMetadataList",
            "apiVersion": META,
            "metadata": lst.metadata,
            "items": [_partial(item.metadata) for item in lst.items],
        }
    )


# --- Table -------------------------------------------------------------------------------------------

TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io"


def column_definitions(kind: ResourceKind) -> list[dict]:
    name = {
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": "Name must be unique within a namespace.",
        "priority": 0,
    }
    return [name] + [column.to_table() for column in kind.columns]


class _Row(msgspec.Struct):
    cells: list
    object: msgspec.Raw = msgspec.Raw(b"")  # empty: includeObject=None


class _Table(msgspec.Struct):
    metadata: dict = {}
    columnDefinitions: list[dict] | None = None  # null after the first event of a watch
    rows: list[_Row] | None = None


_decode_table = msgspec.json.Decoder(_Table).decode


class TableConverter:
    """Turns kube-apiserver's Table of the storage CRD (raw field cells) into the v1 Table.

    Used for kinds whose every column is rendered from raw fields (``kind.table_from_fields``)."""

    def __init__(self, kind: ResourceKind):
        self.kind = kind
        self.index = {"Name": 0} | {f.name: i + 1 for i, f in enumerate(kind.fields)}

    def _row(self, row: _Row) -> dict:
        cells = row.cells
        index = self.index
        out = [cells[0]]
        for column in self.kind.columns:
            out.append(column.render({f.name: cells[index[f.name]] for f in column.fields}))
        converted = {"cells": out}
        if len(row.object):
            converted["object"] = msgspec.Raw(public_bytes(bytes(row.object)))
        return converted

    def table(self, data: bytes, with_columns: bool = True) -> bytes:
        table = _decode_table(data)
        if table.columnDefinitions:
            self.index = {c["name"]: i for i, c in enumerate(table.columnDefinitions)}
        return _encode(
            {
                "kind": "Table",
                "apiVersion": META,
                "metadata": table.metadata,
                "columnDefinitions": column_definitions(self.kind) if with_columns else [],
                "rows": [self._row(row) for row in table.rows or ()],
            }
        )

    def event(self, line: bytes, with_columns: bool) -> bytes:
        event = _decode_event(line)
        if event.type == "ERROR":
            return line
        return _encode({"type": event.type, "object": msgspec.Raw(self.table(bytes(event.object), with_columns))})


def _object_row(kind: ResourceKind, item: _Item, include_object: str, now: datetime) -> dict:
    head = _decode_head(item.metadata)
    view = {"metadata": {"name": head.name}, "spec": item.spec, "status": item.status}
    raw = {"Age": None}
    created = parse_time(head.creationTimestamp)
    if created:
        raw["Age"] = human_duration((now - created).total_seconds())
    cells = [head.name]
    for column in kind.columns:
        if column.object_render is not None:
            cells.append(column.object_render(view))
        else:
            values = {f.name: raw.get(f.name, _json_path(view, f.json_path)) for f in column.fields}
            cells.append(column.render(values))
    row = {"cells": cells}
    if include_object == "Object":
        full = {"apiVersion": PUBLIC, "kind": kind.kind, "metadata": msgspec.Raw(public_bytes(bytes(item.metadata)))}
        if item.spec:
            full["spec"] = item.spec
        if item.status:
            full["status"] = item.status
        row["object"] = full
    elif include_object == "Metadata":
        row["object"] = _partial(item.metadata)
    return row


def _json_path(view: dict, path: str):
    """The simple dotted JSONPaths of object-rendered kinds (no filters)."""
    cur = view
    for key in path.strip(".").split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return cur


def table_from_objects(
    kind: ResourceKind, data: bytes, *, is_list: bool, include_object: str, with_columns=True
) -> bytes:
    """A v1 Table rendered from storage objects (for kinds with object-rendered columns)."""
    now = datetime.now(UTC)
    if is_list:
        lst = _decode_list(data)
        items, metadata = lst.items, lst.metadata
    else:
        item = _decode_item(data)
        items, metadata = [item], {"resourceVersion": _decode_head(item.metadata).resourceVersion}
    return _encode(
        {
            "kind": "Table",
            "apiVersion": META,
            "metadata": {
                k: v for k, v in metadata.items() if k in ("resourceVersion", "continue", "remainingItemCount")
            },
            "columnDefinitions": column_definitions(kind) if with_columns else [],
            "rows": [_object_row(kind, item, include_object, now) for item in items],
        }
    )


def object_table_event(kind: ResourceKind, line: bytes, include_object: str, with_columns: bool) -> bytes:
    """One watch event whose object becomes a one-row Table (a bookmark: a Table with no rows)."""
    event = _decode_event(line)
    if event.type == "ERROR":
        return line
    if event.type == "BOOKMARK":
        head = _decode_head(_decode_item(event.object).metadata)
        table = {
            "kind": "Table",
            "apiVersion": META,
            "metadata": {"resourceVersion": head.resourceVersion},
            "columnDefinitions": column_definitions(kind) if with_columns else [],
            "rows": [],
        }
        return _encode({"type": event.type, "object": table})
    table = table_from_objects(
        kind, bytes(event.object), is_list=False, include_object=include_object, with_columns=with_columns
    )
    return _encode({"type": event.type, "object": msgspec.Raw(table)})


def partial_event_bytes(line: bytes) -> bytes:
    event = _decode_event(line)
    if event.type == "ERROR":
        return line
    return _encode({"type": event.type, "object": msgspec.Raw(partial_bytes(bytes(event.object)))})


def include_object_policy(query) -> str:
    value = query.get("includeObject") or "Metadata"
    return value if value in ("None", "Metadata", "Object") else "Metadata"
