"""Accept and Content-Type negotiation as kube-apiserver does it, for the representations we serve.

Clients send lists with parameters and q-values, e.g. kubectl's
``application/json;as=Table;v=v1;g=meta.k8s.io,application/json`` or the garbage collector's
``application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;...``.
We serve JSON only: plain objects, ``Table``, ``PartialObjectMetadata`` and ``PartialObjectMetadataList``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer

from .status import NotAcceptable, UnsupportedMediaType

OBJECT = "Object"
TABLE = "Table"
PARTIAL = "PartialObjectMetadata"
PARTIAL_LIST = "PartialObjectMetadataList"

JSON_TYPES = ("application/json", "application/*", "*/*")


@dataclass(frozen=True)
class MediaRange:
    type: str
    params: dict
    q: float
    order: int


def parse_accept(header: str) -> list[MediaRange]:
    ranges = []
    for order, part in enumerate(p for p in header.split(",") if p.strip()):
        pieces = [p.strip() for p in part.split(";")]
        params = {}
        q = 1.0
        for piece in pieces[1:]:
            key, _, value = piece.partition("=")
            key, value = key.strip().lower(), value.strip().strip('"')
            if key == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
            else:
                params[key] = value
        ranges.append(MediaRange(pieces[0].lower(), params, q, order))
    return sorted(ranges, key=lambda r: (-r.q, r.order))


def choose(header: str | None, allowed: tuple[str, ...]) -> str:
    """Which representation to send: ``OBJECT`` (plain JSON) or one of ``allowed``.

    ``allowed`` lists the transformed kinds that make sense for the request (Table and
    PartialObjectMetadataList for a list, Table and PartialObjectMetadata for a get or a watch).
    Raises ``NotAcceptable`` when nothing in the header can be served (a protobuf-only client).
    """
    if not header or not header.strip():
        return OBJECT
    for media in parse_accept(header):
        if media.q <= 0 or media.type not in JSON_TYPES:
            continue
        as_kind = media.params.get("as")
        if not as_kind:
            return OBJECT
        if as_kind in allowed and media.params.get("g") == "meta.k8s.io" and media.params.get("v") == "v1":
            return as_kind
    raise NotAcceptable(
        "only the following media types are accepted: application/json, "
        "application/json;as=Table;v=v1;g=meta.k8s.io, "
        "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io, "
        "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
    )


PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/apply-patch+yaml": "apply",
}
BODY_TYPES = ("application/json", "application/yaml", "")


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def patch_type(content_type: str | None) -> str:
    """The patch kind of a PATCH body; strategic merge patch is refused (clients fall back on 415)."""
    kind = PATCH_TYPES.get(media_type(content_type))
    if kind is None:
        raise UnsupportedMediaType(
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        )
    return kind


def check_body_type(content_type: str | None) -> str:
    media = media_type(content_type)
    if media not in BODY_TYPES:
        raise UnsupportedMediaType(
            "the body of the request was in an unknown format - accepted media types include: "
            "application/json, application/yaml"
        )
    return media


class PassThroughNegotiation(BaseContentNegotiation):
    """The views pick their representation themselves (``choose``); DRF must not refuse first."""

    def select_parser(self, request, parsers):
        return None

    def select_renderer(self, request, renderers, format_suffix=None):
        return JSONRenderer(), "application/json"
