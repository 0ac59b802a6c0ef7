"""What the v1 API sends, as DRF renderers: objects at v1, Tables and PartialObjectMetadata(List).

A view hands a renderer either a Python object (``progress``, also as a one-row Table; discovery) or
``StorageAnswer``: the bytes kube-apiserver answered for the storage version. Storage answers are
rewritten as bytes, never decoded whole (the fast path: an object or a list at v1 costs one
``bytes.replace``). Each renderer also turns the lines of a watch stream (``watch_transform``) and may
ask kube-apiserver for a form of its own (``upstream_accept``: the CRD's Table, whose raw cells become
the v1 columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from rest_framework.renderers import BaseRenderer

from gpustack_models.api import partial, tables
from gpustack_models.api.conversion import public_bytes
from gpustack_models.kinds import ResourceKind

TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io"


@dataclass(frozen=True)
class StorageAnswer:
    """A body from kube-apiserver for the storage version: one object, a list, or the CRD's Table."""

    data: bytes
    is_list: bool = False
    is_table: bool = False


class KubeRenderer(BaseRenderer):
    media_type = "application/json"
    format = "json"
    charset = None
    kube_as: str | None = None  # the Accept ``as=`` parameter this renderer answers

    def describe(self) -> str:
        if self.kube_as is None:
            return self.media_type
        return f"{self.media_type};as={self.kube_as};v=v1;g=meta.k8s.io"

    def upstream_accept(self, kind: ResourceKind) -> str | None:
        """The Accept to send kube-apiserver instead of plain JSON, if any."""
        return None

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        if isinstance(data, StorageAnswer):
            return self.render_storage(data, (renderer_context or {}).get("view"))
        return orjson.dumps(data)

    def render_storage(self, answer: StorageAnswer, view) -> bytes:
        return public_bytes(answer.data)

    def watch_transform(self, view):
        """A callable turning one upstream watch event line into the line the client asked for."""
        return public_bytes


class ObjectRenderer(KubeRenderer):
    """Objects, lists and watch events at v1."""


class TableRenderer(KubeRenderer):
    kube_as = "Table"

    def upstream_accept(self, kind: ResourceKind) -> str | None:
        return TABLE_ACCEPT if kind.table_from_fields else None

    def render_storage(self, answer: StorageAnswer, view) -> bytes:
        if answer.is_table:
            return tables.TableConverter(view.kind).table(answer.data)
        include = tables.include_object_policy(view.query)
        return tables.table_from_objects(view.kind, answer.data, is_list=answer.is_list, include_object=include)

    def watch_transform(self, view):
        return TableEvents(view.kind, tables.include_object_policy(view.query))


class ProgressTableRenderer(TableRenderer):
    """The ``progress`` answer (a Python object, computed per request) as a one-row Table."""

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        view = (renderer_context or {}).get("view")
        return tables.progress_table(data, tables.include_object_policy(view.query))


class FilesTableRenderer(TableRenderer):
    """The ``files`` answer as a Table of one row per file."""

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        view = (renderer_context or {}).get("view")
        return tables.files_table(data, tables.include_object_policy(view.query))


class TableEvents:
    """Watch events as one-row Tables; the column definitions ride on the first event only."""

    def __init__(self, kind: ResourceKind, include_object: str):
        self.kind = kind
        self.include_object = include_object
        self.first = True
        self.converter = tables.TableConverter(kind) if kind.table_from_fields else None

    def __call__(self, line: bytes) -> bytes:
        with_columns, self.first = self.first, False
        if self.converter is not None:
            return self.converter.event(line, with_columns=with_columns)
        return tables.object_table_event(self.kind, line, self.include_object, with_columns=with_columns)


class PartialObjectMetadataRenderer(KubeRenderer):
    kube_as = "PartialObjectMetadata"

    def render_storage(self, answer: StorageAnswer, view) -> bytes:
        return partial.partial_bytes(answer.data)

    def watch_transform(self, view):
        return partial.partial_event_bytes


class PartialObjectMetadataListRenderer(KubeRenderer):
    kube_as = "PartialObjectMetadataList"

    def render_storage(self, answer: StorageAnswer, view) -> bytes:
        return partial.partial_list_bytes(answer.data)


# What a read may be answered with: a collection (list) and a single object (get, and every watch).
LIST_RENDERERS = (ObjectRenderer, TableRenderer, PartialObjectMetadataListRenderer)
OBJECT_RENDERERS = (ObjectRenderer, TableRenderer, PartialObjectMetadataRenderer)
PROGRESS_RENDERERS = (ObjectRenderer, ProgressTableRenderer)
FILES_RENDERERS = (ObjectRenderer, FilesTableRenderer)
