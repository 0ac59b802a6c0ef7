"""Accept and Content-Type negotiation as kube-apiserver does it, for the representations we serve.

Clients send lists with parameters and q-values, e.g. kubectl's
``application/json;as=Table;v=v1;g=meta.k8s.io,application/json`` or the garbage collector's
``application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;...``.
We serve JSON only: plain objects, ``Table``, ``PartialObjectMetadata`` and ``PartialObjectMetadataList``;
each is a renderer whose ``kube_as`` names the ``as=`` parameter it answers (``None``: a plain object).
"""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework.negotiation import BaseContentNegotiation

from gpustack_models.kube.errors import NotAcceptable

JSON_TYPES = ("application/json", "application/*", "*/*")
META_GROUP, META_VERSION = "meta.k8s.io", "v1"


@dataclass(frozen=True)
class MediaRange:
    type: str
    params: dict
    q: float
    order: int


def _media_range(order: int, part: str) -> MediaRange:
    pieces = [p.strip() for p in part.split(";")]
    params, q = {}, 1.0
    for piece in pieces[1:]:
        key, _, value = piece.partition("=")
        key, value = key.strip().lower(), value.strip().strip('"')
        if key != "q":
            params[key] = value
            continue
        try:
            q = float(value)
        except ValueError:
            q = 0.0
    return MediaRange(pieces[0].lower(), params, q, order)


def parse_accept(header: str) -> list[MediaRange]:
    """The media ranges of an Accept header, most preferred first (q-value, then order)."""
    ranges = [_media_range(order, part) for order, part in enumerate(p for p in header.split(",") if p.strip())]
    return sorted(ranges, key=lambda r: (-r.q, r.order))


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def acceptable(media: MediaRange, renderer) -> bool:
    """Whether ``renderer`` answers ``media`` (a JSON range whose ``as``/``g``/``v`` name it)."""
    if media.q <= 0 or media.type not in JSON_TYPES:
        return False
    as_kind = media.params.get("as")
    if not as_kind:
        return renderer.kube_as is None
    return as_kind == renderer.kube_as and media.params.get("g") == META_GROUP and media.params.get("v") == META_VERSION


def not_acceptable(renderers) -> NotAcceptable:
    types = ", ".join(renderer.describe() for renderer in renderers)
    return NotAcceptable(f"only the following media types are accepted: {types}")


class KubeContentNegotiation(BaseContentNegotiation):
    """Picks the view's renderer as kube-apiserver reads Accept; a body's parser by its media type."""

    def select_parser(self, request, parsers):
        wanted = media_type(request.content_type) or "application/json"
        for parser in parsers:
            if parser.media_type == wanted:
                return parser
        return None

    def select_renderer(self, request, renderers, format_suffix=None):
        header = request.META.get("HTTP_ACCEPT") or ""
        if not header.strip():
            return renderers[0], renderers[0].media_type
        for media in parse_accept(header):
            for renderer in renderers:
                if acceptable(media, renderer):
                    return renderer, renderer.media_type
        raise not_acceptable(renderers)


class JSONOnlyNegotiation(KubeContentNegotiation):
    """Always plain JSON, whatever Accept says: discovery and OpenAPI, which kube-apiserver fetches with
    Accept headers of its own and falls back from on its own terms."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def wants_aggregated_discovery(accept: str | None) -> bool:
    return any(m.params.get("as") == "APIGroupDiscoveryList" for m in parse_accept(accept or ""))
