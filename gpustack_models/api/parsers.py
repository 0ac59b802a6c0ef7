"""Request bodies of the v1 API as DRF parsers: JSON and YAML objects, and the three patch types.

DRF picks the parser by ``Content-Type`` (``negotiation.KubeContentNegotiation.select_parser``); a type
no parser of the view takes (a strategic merge patch, say) is DRF's own 415, which the exception handler
turns into a ``Status`` listing the types the view takes. A body that does not decode is a 400 ``Status``.
Every parser reads at most ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes (kube-apiserver's own limit).
"""

from __future__ import annotations

import orjson
import yaml
from django.conf import settings
from rest_framework.parsers import BaseParser

from gpustack_models.kube.errors import BadRequest, RequestEntityTooLarge

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_DEPTH = 100  # nesting of a YAML body; JSON's own decoder stops at 1024
_OPENING = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSING = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


class KubeBodyParser(BaseParser):
    """Reads the body within the size limit and decodes it; subclasses say how and what shape."""

    shape: type | None = dict  # the JSON type the body must decode to (None: anything)
    shape_message = "the body of the request must be a JSON object"
    max_bytes: int | None = None  # a view's own, smaller bound (None: DATA_UPLOAD_MAX_MEMORY_SIZE)

    def parse(self, stream, media_type=None, parser_context=None):
        limit = self.max_bytes or settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if stream is not None else b""
        if limit is not None and len(raw) > limit:
            raise RequestEntityTooLarge(f"the request body is larger than {limit} bytes")
        try:
            value = self.decode(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise BadRequest(f"the body of the request could not be decoded: {exc}") from None
        if self.shape is not None and not isinstance(value, self.shape):
            raise BadRequest(self.shape_message)
        return value

    def decode(self, raw: bytes):
        return orjson.loads(raw or b"null")


class JSONParser(KubeBodyParser):
    media_type = "application/json"


class YAMLParser(KubeBodyParser):
    """YAML without aliases: an alias bomb of a few hundred bytes expands to gigabytes when constructed,
    so the events are checked first (no alias or anchor, bounded nesting), and the decoded form must fit
    the body limit as JSON."""

    media_type = "application/yaml"

    def decode(self, raw: bytes):
        check_yaml_events(raw)
        value = yaml.load(raw, Loader=_YAML_LOADER)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and len(orjson.dumps(value, default=str)) > limit:
            raise RequestEntityTooLarge(f"the request body decodes to more than {limit} bytes")
        return value


def check_yaml_events(raw: bytes) -> None:
    """Refuse aliases and anchors, and nesting deeper than ``MAX_DEPTH``, before anything is built."""
    depth = 0
    for event in yaml.parse(raw, Loader=_YAML_LOADER):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise BadRequest("YAML aliases and anchors are not accepted in request bodies")
        if isinstance(event, _OPENING):
            depth += 1
            if depth > MAX_DEPTH:
                raise BadRequest(f"the request body nests deeper than {MAX_DEPTH} levels")
        elif isinstance(event, _CLOSING):
            depth -= 1


class JSONPatchParser(KubeBodyParser):
    """RFC 6902 JSON patch: a list of operations."""

    media_type = "application/json-patch+json"
    patch_type = "json"
    shape = list
    shape_message = "a JSON patch must be a JSON array of operations"


class MergePatchParser(KubeBodyParser):
    """RFC 7386 JSON merge patch."""

    media_type = "application/merge-patch+json"
    patch_type = "merge"
    shape_message = "a merge patch must be a JSON object"


class ApplyPatchParser(YAMLParser):
    """Server-side apply: a YAML (or JSON) object."""

    media_type = "application/apply-patch+yaml"
    patch_type = "apply"
    shape_message = "an apply patch must be an object"


OBJECT_PARSERS = (JSONParser, YAMLParser)
PATCH_PARSERS = (JSONPatchParser, MergePatchParser, ApplyPatchParser)
PATCH_TYPES = {parser.media_type: parser.patch_type for parser in PATCH_PARSERS}
