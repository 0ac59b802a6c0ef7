"""What the public v1 API sends: objects at v1, Tables, PartialObjectMetadata(List).

The storage objects are ``worker.gpustack.ai/v1alpha1``; the public version is ``v1``. The schemas are the
same, so conversion is the apiVersion of the object, of list items, and of managedFields entries.
"""

from __future__ import annotations

from .resources.formatting import age
from .resources.kinds import GROUP, PUBLIC_VERSION, STORAGE_VERSION, ResourceKind

PUBLIC = f"{GROUP}/{PUBLIC_VERSION}"
STORAGE = f"{GROUP}/{STORAGE_VERSION}"
META = "meta.k8s.io/v1"


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _swap(obj: dict, source: str, target: str) -> dict:
    if obj.get("apiVersion") == source:
        obj["apiVersion"] = target
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        for entry in metadata.get("managedFields") or ():
            if isinstance(entry, dict) and entry.get("apiVersion") == source:
                entry["apiVersion"] = target
        # Server-side apply keeps kubectl's client-side annotation in step with what it received, which
        # is the storage version; it is kubectl's own compact JSON.
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict) and isinstance(annotations.get(LAST_APPLIED), str):
            annotations[LAST_APPLIED] = annotations[LAST_APPLIED].replace(
                f'"apiVersion":"{source}"', f'"apiVersion":"{target}"', 1
            )
    return obj


def to_public(obj: dict) -> dict:
    """Rewrite a storage object or list (in place) to v1."""
    _swap(obj, STORAGE, PUBLIC)
    if obj.get("kind", "").endswith("List") and isinstance(obj.get("items"), list):
        if obj.get("apiVersion") == STORAGE:
            obj["apiVersion"] = PUBLIC
        for item in obj["items"]:
            if isinstance(item, dict):
                _swap(item, STORAGE, PUBLIC)
    return obj


def to_storage(obj: dict) -> dict:
    """Rewrite a v1 request body (in place) to the storage version."""
    return _swap(obj, PUBLIC, STORAGE)


def partial(obj: dict) -> dict:
    return {"kind": "PartialObjectMetadata", "apiVersion": META, "metadata": to_public(obj).get("metadata", {})}


def partial_list(lst: dict) -> dict:
    return {
        "kind": "PartialObjectMetadataList",
        "apiVersion": META,
        "metadata": lst.get("metadata", {}),
        "items": [partial(item) for item in lst.get("items", [])],
    }


# --- Table -------------------------------------------------------------------------------------------


def column_definitions(kind: ResourceKind) -> list[dict]:
    name = {
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": "Name must be unique within a namespace.",
        "priority": 0,
    }
    return [name] + [column.to_table() for column in kind.columns]


def _cell(column, obj: dict):
    if column.name == "Age":
        return age((obj.get("metadata") or {}).get("creationTimestamp"))
    return column.render(obj) if column.render else ""


def row(kind: ResourceKind, obj: dict, include_object: str) -> dict:
    cells = [(obj.get("metadata") or {}).get("name", "")] + [_cell(c, obj) for c in kind.columns]
    out = {"cells": cells}
    if include_object == "Object":
        out["object"] = to_public(obj)
    elif include_object == "Metadata":
        out["object"] = partial(obj)
    return out


def table(kind: ResourceKind, objects: list[dict], metadata: dict, include_object: str, with_columns=True) -> dict:
    out = {
        "kind": "Table",
        "apiVersion": META,
        "metadata": {k: v for k, v in metadata.items() if k in ("resourceVersion", "continue", "remainingItemCount")},
        "columnDefinitions": column_definitions(kind) if with_columns else [],
        "rows": [row(kind, obj, include_object) for obj in objects],
    }
    return out


def include_object_policy(query) -> str:
    value = query.get("includeObject") or "Metadata"
    return value if value in ("None", "Metadata", "Object") else "Metadata"
