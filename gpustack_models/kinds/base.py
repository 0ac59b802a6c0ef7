"""What a resource kind of ``worker.gpustack.ai`` is made of: its fields, columns and schemas.

Each ``ResourceKind`` (one module per kind in this package) drives the v1alpha1 storage CRD (schema, CEL
rules, printer columns), the public v1 API's discovery (verbs, short names, categories), its OpenAPI
document and its Table columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpustack_models.kinds.schema import Schema, obj, string

GROUP = "worker.gpustack.ai"
STORAGE_VERSION = "v1alpha1"
PUBLIC_VERSION = "v1"
CATEGORY = "gpustack"


@dataclass(frozen=True)
class Field:
    """A raw value kube-apiserver reads with JSONPath: one printer column of the storage CRD.

    The v1 Table is rendered from these raw cells (kube-apiserver's own Table of the CRD), so a list never
    has to be decoded object by object in Python.
    """

    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 1

    def to_crd(self) -> dict:
        out = {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description or f"Raw {self.json_path} for the v1 columns.",
        }
        if self.priority:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True)
class Column:
    """A v1 printer column.

    ``fields`` are the raw values it needs and ``render`` turns them (a dict by field name, which may
    hold the row's other fields too) into the cell. A column JSONPath cannot feed (counting list entries)
    has ``object_render`` instead, taking the whole object; a kind with such a column renders its Tables
    from full objects.
    """

    name: str
    type: str
    description: str
    fields: tuple[Field, ...] = ()
    render: Callable[[dict], object] | None = None
    object_render: Callable[[dict], object] | None = None
    priority: int = 0

    def to_table(self) -> dict:
        return {
            "name": self.name,
            "type": self.type,
            "format": "",
            "description": self.description,
            "priority": self.priority,
        }


@dataclass(frozen=True)
class ResourceKind:
    kind: str
    plural: str
    singular: str
    namespaced: bool
    description: str
    spec: Schema
    status: Schema
    columns: tuple[Column, ...]
    verbs: tuple[str, ...]
    short_names: tuple[str, ...]
    categories: tuple[str, ...] = (CATEGORY,)
    subresources: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (name, kind, verbs) in v1
    spec_required: bool = True

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def fields(self) -> tuple[Field, ...]:
        """The storage CRD's printer columns: every raw field of the v1 columns, once, in order."""
        seen: dict[str, Field] = {}
        for column in self.columns:
            for f in column.fields:
                seen.setdefault(f.name, f)
        return tuple(seen.values())

    @property
    def table_from_fields(self) -> bool:
        return all(c.object_render is None for c in self.columns)

    @property
    def scope(self) -> str:
        return "Namespaced" if self.namespaced else "Cluster"

    def object_schema(self) -> Schema:
        """The whole object: apiVersion, kind, metadata, spec, status."""
        return obj(
            self.description,
            required=("spec",) if self.spec_required else (),
            apiVersion=string("APIVersion defines the versioned schema of this representation of an object."),
            kind=string("Kind is a string value representing the REST resource this object represents."),
            metadata=Schema("object"),
            spec=self.spec,
            status=self.status,
        )


# --- Table cell renderers ----------------------------------------------------------------------------


def _get(obj_: dict, *path, default=None):
    cur = obj_
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return default
        cur = cur[key]
    return cur


def artifact_source(v: dict) -> str:
    if v.get("HF Repository"):
        return f"hf:{v['HF Repository']}"
    if v.get("MS Repository"):
        return f"ms:{v['MS Repository']}"
    if v.get("OCI Reference"):
        return f"oci:{v['OCI Reference']}"
    if v.get("S3 Bucket"):
        return f"s3://{v['S3 Bucket']}/" + (v.get("S3 Prefix") or "")
    if v.get("Claim"):
        return f"pvc:{v['Claim']}" + (f"/{v['Claim Path']}" if v.get("Claim Path") else "")
    return ""


def artifact_revision(v: dict) -> str:
    """The revision asked for, resolved or not: a ModelScope source without one takes the repository's
    default branch."""
    asked = v.get("HF Revision") or v.get("MS Revision")
    return asked or ("(default)" if v.get("MS Repository") else "")


def artifact_commit(v: dict) -> str:
    """The first 12 characters of a hub's commit; of a registry's manifest digest, after ``sha256:``."""
    revision = v.get("Revision") or ""
    return revision[:19] if revision.startswith("sha256:") else revision[:12]


def artifact_resolved(v: dict) -> str:
    status = v.get("Resolved")
    if status is None:
        return "Unknown"
    return "True" if status == "True" else (v.get("Resolved Reason") or status)


def count_column(name: str, json_path: str, description: str, field_description: str = "") -> Column:
    """A column counting nodes from one integer of the status (0 while absent), shown by default."""
    raw = Field(name, json_path, "integer", field_description or description, 0)
    return Column(name, "integer", description, fields=(raw,), render=count_of(name))


def count_of(name: str) -> Callable[[dict], int]:
    return lambda v: v.get(name) or 0


def store_models(obj_: dict, state: str | None = None) -> int:
    models = _get(obj_, "status", "models", default=[]) or []
    return sum(1 for m in models if state is None or m.get("state") == state)


AGE = Field("Age", ".metadata.creationTimestamp", "date", "Time since the object was created.")


def age_column() -> Column:
    # kube-apiserver renders date columns as kubectl-style ages; shown by default, as kubectl shows AGE.
    return Column(
        "Age",
        "string",
        "Time since the object was created.",
        fields=(AGE,),
        render=lambda v: v.get("Age") or "<unknown>",
    )
