"""The OpenAPI v2 document of ``worker.gpustack.ai/v1``, from the kind definitions.

kube-apiserver proxies ``/openapi/v2`` and ``/openapi/v3...`` to us. We serve v2 only (``/openapi/v3``
answers 404) and kube-apiserver converts it to v3, which ``kubectl explain`` reads. Patches advertised:
json, merge and apply; never strategic merge.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
from dataclasses import dataclass

from django.http import HttpResponse

from gpustack_models import kube
from gpustack_models.api.negotiation import JSONOnlyNegotiation
from gpustack_models.api.parsers import PATCH_PARSERS
from gpustack_models.api.status import not_found
from gpustack_models.api.views import KubeAPIView
from gpustack_models.kinds import GROUP, KINDS, PUBLIC_VERSION, ResourceKind
from gpustack_models.kinds.schema import Schema, integer, obj, string

log = logging.getLogger(__name__)

GROUP_VERSION = f"{GROUP}/{PUBLIC_VERSION}"
DEFINITION_PREFIX = "ai.gpustack.worker.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
PATCH_TYPES = [parser.media_type for parser in PATCH_PARSERS]

PROGRESS = obj(
    "How far an artifact's content is across the cluster, computed on request, over the nodes it was placed on. "
    "Names no node.",
    apiVersion=string("worker.gpustack.ai/v1"),
    kind=string("ModelArtifactProgress"),
    metadata=Schema("object", "The artifact's name and namespace."),
    timestamp=string("When the answer was computed.", format="date-time"),
    manifestDigest=string("The content's digest."),
    sizeBytes=integer("Size of the content.", int64=True),
    ready=integer("Nodes holding the content published."),
    downloading=integer("Nodes downloading it."),
    failed=integer("Nodes waiting to retry a failed attempt."),
    downloadingPercent=integer("Mean percent of the downloading nodes; absent while none downloads."),
    downloadingBytes=integer("Bytes the downloading nodes hold, summed.", int64=True),
    live=integer("Nodes whose bytes were read live for this answer."),
    bytesPerSecond=integer(
        "Bytes per second the live downloading nodes receive, summed (each over about its last 10 s); absent "
        "when no node was read live.",
        int64=True,
    ),
    etaSeconds=integer(
        "Seconds until the last downloading node holds the content at its current rate; absent unless every "
        "downloading node was read live and is receiving bytes."
    ),
    failureReasons=Schema(
        "array",
        "Failure reasons (each one of the NodeModelStore's fixed reasons) and how many nodes have each.",
        items=obj(reason=string(), count=integer()),
    ),
    reason=string("Why there is nothing to count (unresolved artifact, claim source)."),
)


FILES = obj(
    "The files of an artifact's resolved content, as every node downloads and verifies them.",
    apiVersion=string("worker.gpustack.ai/v1"),
    kind=string("ModelArtifactFiles"),
    metadata=Schema("object", "The artifact's name and namespace."),
    manifestDigest=string("The content's digest."),
    files=Schema(
        "array",
        "The files, by path.",
        items=obj(
            path=string("The file's path in the content."),
            sizeBytes=integer("The file's size.", int64=True),
            digest=string(
                "What the file is verified against: sha256:<hex>, or gitsha1:<hex> (git's blob hash) for a small "
                "file kept in git."
            ),
        ),
    ),
    reason=string("Why no file is listed (unresolved artifact, claim source)."),
)


def _v2_schema(schema: Schema) -> dict:
    """OpenAPI v2 has no CEL rules and no list-map markers kubectl needs; keep the documentation."""
    out = schema.to_openapi()

    def clean(node):
        if isinstance(node, dict):
            node.pop("x-kubernetes-validations", None)
            node.pop("x-kubernetes-int-or-string", None)
            for value in node.values():
                clean(value)
        elif isinstance(node, list):
            for value in node:
                clean(value)

    clean(out)
    return out


def _gvk(kind: str) -> dict:
    return {"group": GROUP, "version": PUBLIC_VERSION, "kind": kind}


def _object_definition(kind: ResourceKind) -> dict:
    definition = _v2_schema(kind.object_schema())
    definition["properties"]["metadata"] = {
        "description": "Standard object's metadata.",
        "$ref": f"#/definitions/{META}ObjectMeta",
    }
    definition["x-kubernetes-group-version-kind"] = [_gvk(kind.kind)]
    return definition


def _list_definition(kind: ResourceKind) -> dict:
    return {
        "description": f"A list of {kind.kind}.",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this representation."},
            "kind": {"type": "string", "description": "Kind of this representation."},
            "metadata": {"$ref": f"#/definitions/{META}ListMeta"},
            "items": {"type": "array", "items": {"$ref": f"#/definitions/{DEFINITION_PREFIX}{kind.kind}"}},
        },
        "x-kubernetes-group-version-kind": [_gvk(kind.list_kind)],
    }


def _param(name, where="query", type_="string", description="", required=False, **extra) -> dict:
    out = {"name": name, "in": where, "type": type_, "uniqueItems": True}
    if description:
        out["description"] = description
    if required:
        out["required"] = True
    out.update(extra)
    return out


LIST_PARAMS = [
    _param("labelSelector", description="A selector to restrict the list of returned objects by their labels."),
    _param("fieldSelector", description="A selector to restrict the list of returned objects by their fields."),
    _param("limit", type_="integer", description="Maximum number of responses to return for a list call."),
    _param("continue", description="The continue token of a previous chunked list."),
    _param("resourceVersion", description="Show changes after this resource version (watch) or be at least as new."),
    _param("resourceVersionMatch", description="How resourceVersion applies to list calls."),
    _param("timeoutSeconds", type_="integer", description="Timeout for the list/watch call."),
    _param("watch", type_="boolean", description="Watch for changes to the described resources."),
    _param("allowWatchBookmarks", type_="boolean", description="Request watch events with type BOOKMARK."),
    _param("sendInitialEvents", type_="boolean", description="Start a watch with synthetic ADDED events."),
]
WRITE_PARAMS = [
    _param("dryRun", description="When present, modifications are not persisted (All)."),
    _param("fieldManager", description="The name of the actor making the change."),
    _param("fieldValidation", description="Ignore, Warn or Strict handling of unknown or duplicate fields."),
]


def _response(ref: str) -> dict:
    return {
        "200": {"description": "OK", "schema": {"$ref": f"#/definitions/{ref}"}},
        "401": {"description": "Unauthorized"},
    }


def _operation(kind: ResourceKind, action: str, op_id: str, ref: str, *, body=False, consumes=None, params=()) -> dict:
    op = {
        "description": f"{action} {kind.kind}",
        "operationId": op_id,
        "consumes": consumes or ["*/*"],
        "produces": ["application/json", "application/yaml"],
        "schemes": ["https"],
        "tags": [f"worker{PUBLIC_VERSION.capitalize()}"],
        "responses": _response(ref),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(kind.kind),
        "parameters": list(params),
    }
    if body:
        op["parameters"].append(
            {"name": "body", "in": "body", "required": True, "schema": {"$ref": f"#/definitions/{ref}"}}
        )
    return op


@dataclass(frozen=True)
class _Names:
    """How one kind's paths and operations are named."""

    kind: ResourceKind

    @property
    def scoped(self) -> str:
        return "Namespaced" if self.kind.namespaced else ""

    def operation_id(self, action: str, suffix: str = "") -> str:
        return f"{action}WorkerV1{self.scoped}{self.kind.kind}{suffix}"

    @property
    def object_ref(self) -> str:
        return f"{DEFINITION_PREFIX}{self.kind.kind}"

    @property
    def list_ref(self) -> str:
        return f"{DEFINITION_PREFIX}{self.kind.list_kind}"

    @property
    def collection(self) -> str:
        ns_path = "/namespaces/{namespace}" if self.kind.namespaced else ""
        return f"/apis/{GROUP_VERSION}{ns_path}/{self.kind.plural}"

    @property
    def namespace_params(self) -> list[dict]:
        if not self.kind.namespaced:
            return []
        return [_param("namespace", "path", required=True, description="object name and auth scope")]

    @property
    def item_params(self) -> list[dict]:
        return self.namespace_params + [
            _param("name", "path", required=True, description=f"name of the {self.kind.kind}")
        ]


def _collection_operations(kind: ResourceKind, names: _Names) -> dict:
    ops = {"get": _operation(kind, "list", names.operation_id("list"), names.list_ref, params=LIST_PARAMS)}
    if "create" in kind.verbs:
        ops["post"] = _operation(
            kind, "post", names.operation_id("create"), names.object_ref, body=True, params=WRITE_PARAMS
        )
    ops["parameters"] = names.namespace_params
    return ops


def _patch_operation(kind: ResourceKind, names: _Names) -> dict:
    force = _param("force", type_="boolean", description="Force apply.")
    patch = _operation(
        kind,
        "patch",
        names.operation_id("patch"),
        names.object_ref,
        consumes=PATCH_TYPES,
        params=WRITE_PARAMS + [force],
    )
    body = {"name": "body", "in": "body", "required": True, "schema": {"$ref": f"#/definitions/{META}Patch"}}
    patch["parameters"].append(body)
    return patch


def _item_operations(kind: ResourceKind, names: _Names) -> dict:
    ops = {"get": _operation(kind, "get", names.operation_id("read"), names.object_ref)}
    if "update" in kind.verbs:
        ops["put"] = _operation(
            kind, "put", names.operation_id("replace"), names.object_ref, body=True, params=WRITE_PARAMS
        )
    if "patch" in kind.verbs:
        ops["patch"] = _patch_operation(kind, names)
    if "delete" in kind.verbs:
        delete_params = [_param("gracePeriodSeconds", type_="integer"), _param("propagationPolicy"), _param("dryRun")]
        ops["delete"] = _operation(kind, "delete", names.operation_id("delete"), f"{META}Status", params=delete_params)
    ops["parameters"] = names.item_params
    return ops


def _paths(kind: ResourceKind) -> dict:
    names = _Names(kind)
    item = names.collection + "/{name}"
    paths = {names.collection: _collection_operations(kind, names), item: _item_operations(kind, names)}
    if kind.namespaced:
        every_namespace = f"listWorkerV1{kind.kind}ForAllNamespaces"
        paths[f"/apis/{GROUP_VERSION}/{kind.plural}"] = {
            "get": _operation(kind, "list", every_namespace, names.list_ref, params=LIST_PARAMS)
        }
    for sub, sub_kind, _verbs in kind.subresources:
        op = _operation(kind, "get", names.operation_id("read", sub.capitalize()), f"{DEFINITION_PREFIX}{sub_kind}")
        op["x-kubernetes-group-version-kind"] = _gvk(sub_kind)
        paths[f"{item}/{sub}"] = {"get": op, "parameters": names.item_params}
    return paths


_META_NEEDED = ("ObjectMeta", "ListMeta", "Status", "Patch", "DeleteOptions")
_meta_lock = threading.Lock()
_meta_definitions: dict | None = None


def _referenced(definitions: dict, roots) -> dict:
    """The named definitions and everything they reference, transitively."""
    out, todo = {}, [f"{META}{r}" for r in roots]
    while todo:
        name = todo.pop()
        if name in out or name not in definitions:
            continue
        out[name] = definitions[name]
        text = json.dumps(definitions[name])
        for part in text.split('"#/definitions/')[1:]:
            todo.append(part.split('"', 1)[0])
    return out


def meta_definitions() -> dict:
    """ObjectMeta and friends exactly as kube-apiserver defines them, so that when it merges our document
    into its own the definitions are identical and nothing is renamed."""
    global _meta_definitions
    if _meta_definitions is None:
        with _meta_lock:
            if _meta_definitions is None:
                try:
                    full = kube.default().get("/openapi/v2", timeout=60)
                    _meta_definitions = _referenced(full.get("definitions", {}), _META_NEEDED)
                except Exception as exc:  # the document still serves; metadata then reads as an object
                    log.warning("could not read kube-apiserver's OpenAPI definitions: %s", exc)
                    return {f"{META}{r}": {"type": "object"} for r in _META_NEEDED}
    return _meta_definitions


_document: tuple[bytes, str] | None = None


def openapi_v2() -> tuple[bytes, str]:
    """The document and its ETag (computed once per process)."""
    global _document
    if _document is None:
        definitions = copy.deepcopy(meta_definitions())
        paths = {}
        for kind in KINDS:
            definitions[f"{DEFINITION_PREFIX}{kind.kind}"] = _object_definition(kind)
            definitions[f"{DEFINITION_PREFIX}{kind.list_kind}"] = _list_definition(kind)
            paths.update(_paths(kind))
        for name, schema in (("ModelArtifactProgress", PROGRESS), ("ModelArtifactFiles", FILES)):
            definitions[f"{DEFINITION_PREFIX}{name}"] = _v2_schema(schema)
            definitions[f"{DEFINITION_PREFIX}{name}"]["x-kubernetes-group-version-kind"] = [_gvk(name)]
        doc = {
            "swagger": "2.0",
            "info": {"title": "gpustack-models", "version": PUBLIC_VERSION},
            "paths": paths,
            "definitions": definitions,
            "securityDefinitions": {"BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}},
            "security": [{"BearerToken": []}],
        }
        body = json.dumps(doc, sort_keys=True).encode()
        _document = (body, '"' + hashlib.sha512(body).hexdigest()[:32].upper() + '"')
    return _document


class OpenAPIV2View(KubeAPIView):
    content_negotiation_class = JSONOnlyNegotiation

    def get(self, request):
        body, etag = openapi_v2()
        if request.META.get("HTTP_IF_NONE_MATCH") == etag:
            response = HttpResponse(status=304)
        else:
            response = HttpResponse(body, content_type="application/json")
        response["ETag"] = etag
        response["Cache-Control"] = "no-cache, private"
        return response


class OpenAPIV3View(KubeAPIView):
    """Not served: kube-apiserver then converts our v2 document to v3 itself."""

    content_negotiation_class = JSONOnlyNegotiation

    def get(self, request, rest=""):
        raise not_found()
