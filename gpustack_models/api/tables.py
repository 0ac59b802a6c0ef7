"""v1 Tables (``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``), also over watch.

For kinds whose columns all come from raw fields, kube-apiserver renders the storage CRD's Table (its
printer columns are those raw fields) and ``TableConverter`` only turns the cells into the v1 columns,
so a list is never decoded object by object. Kinds with a column JSONPath cannot feed (counting list
entries) render rows from objects (``table_from_objects``).
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from gpustack_models.api.conversion import PUBLIC, public_bytes
from gpustack_models.api.partial import META, Item, decode_event, decode_head, decode_item, decode_list, encode, partial
from gpustack_models.kinds import FILES_COLUMNS, PROGRESS_COLUMNS, Column, ResourceKind
from gpustack_models.kinds.formatting import human_duration, parse_time

_NAME = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace.",
    "priority": 0,
}


def definitions(columns: tuple[Column, ...]) -> list[dict]:
    """Name, then ``columns``."""
    return [_NAME] + [column.to_table() for column in columns]


def column_definitions(kind: ResourceKind) -> list[dict]:
    return definitions(kind.columns)


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
        self.names = ["Name"] + [f.name for f in kind.fields]  # the upstream cells, in order
        self.renders = tuple(column.render for column in kind.columns)

    def _row(self, row: _Row) -> dict:
        cells = row.cells
        values = dict(zip(self.names, cells))  # every column reads its own fields by name
        converted = {"cells": [cells[0], *[render(values) for render in self.renders]]}
        if len(row.object):
            converted["object"] = row.object
        return converted

    def table(self, data: bytes, with_columns: bool = True) -> bytes:
        # Rewritten as a whole, as a list is: the rows' objects are then v1 as they stand.
        table = _decode_table(public_bytes(data))
        if table.columnDefinitions:
            self.names = [c["name"] for c in table.columnDefinitions]
        return encode(
            {
                "kind": "Table",
                "apiVersion": META,
                "metadata": table.metadata,
                "columnDefinitions": column_definitions(self.kind) if with_columns else [],
                "rows": [self._row(row) for row in table.rows or ()],
            }
        )

    def event(self, line: bytes, with_columns: bool) -> bytes:
        event = decode_event(line)
        if event.type == "ERROR":
            return line
        return encode({"type": event.type, "object": msgspec.Raw(self.table(bytes(event.object), with_columns))})


def _object_row(kind: ResourceKind, item: Item, include_object: str, now: datetime) -> dict:
    head = decode_head(item.metadata)
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
        row["object"] = partial(item.metadata)
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
        lst = decode_list(data)
        items, metadata = lst.items, lst.metadata
    else:
        item = decode_item(data)
        items, metadata = [item], {"resourceVersion": decode_head(item.metadata).resourceVersion}
    return encode(
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
    event = decode_event(line)
    if event.type == "ERROR":
        return line
    if event.type == "BOOKMARK":
        head = decode_head(decode_item(event.object).metadata)
        table = {
            "kind": "Table",
            "apiVersion": META,
            "metadata": {"resourceVersion": head.resourceVersion},
            "columnDefinitions": column_definitions(kind) if with_columns else [],
            "rows": [],
        }
        return encode({"type": event.type, "object": table})
    table = table_from_objects(
        kind, bytes(event.object), is_list=False, include_object=include_object, with_columns=with_columns
    )
    return encode({"type": event.type, "object": msgspec.Raw(table)})


def progress_table(progress: dict, include_object: str) -> bytes:
    """The v1 Table of one ``ModelArtifactProgress`` answer: one row, resolved or not.

    The row's object follows ``includeObject``: none, the answer's metadata, or the whole answer."""
    row = {"cells": [progress["metadata"]["name"]] + [column.object_render(progress) for column in PROGRESS_COLUMNS]}
    if include_object == "Object":
        row["object"] = progress
    elif include_object == "Metadata":
        row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": META, "metadata": progress["metadata"]}
    return encode(
        {
            "kind": "Table",
            "apiVersion": META,
            "metadata": {},
            "columnDefinitions": definitions(PROGRESS_COLUMNS),
            "rows": [row],
        }
    )


def files_table(answer: dict, include_object: str) -> bytes:
    """The v1 Table of one ``ModelArtifactFiles`` answer: a row per file; none before it is resolved. Each
    row's object is the answer's metadata (kubectl needs one), or the file itself with ``Object``."""
    rows = []
    for item in answer["files"]:
        row = {"cells": [column.object_render(item) for column in FILES_COLUMNS]}
        if include_object == "Object":
            row["object"] = item
        elif include_object == "Metadata":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": META, "metadata": answer["metadata"]}
        rows.append(row)
    return encode(
        {
            "kind": "Table",
            "apiVersion": META,
            "metadata": {},
            "columnDefinitions": [column.to_table() for column in FILES_COLUMNS],  # the path names the row
            "rows": rows,
        }
    )


def include_object_policy(query) -> str:
    value = query.get("includeObject") or "Metadata"
    return value if value in ("None", "Metadata", "Object") else "Metadata"
