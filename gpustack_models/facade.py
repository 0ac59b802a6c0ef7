"""The public ``worker.gpustack.ai/v1`` resources, carried out on the v1alpha1 storage CRDs.

Each request is authenticated (front proxy or token), authorized with a SubjectAccessReview for the
caller, checked against the v1 verb limits, then sent to kube-apiserver with the worker's identity.
Query parameters, DeleteOptions bodies and content types pass through; apiVersion is rewritten both
ways. Reads always go to kube-apiserver: a read after a write sees the new resourceVersion.

Verb limits of v1 (checked in this order, after authorization):
  strategic merge patch               415 (clients fall back to merge patch on 415 only)
  .../<name>/status                   404 (v1 has no status subresource: the worker owns status)
  .../<name>/progress                 get only (a watch is 405)
  collection DELETE                   405
  nodemodelstores create/update       405; PATCH only of metadata.finalizers and ownerReferences
"""

from __future__ import annotations

import asyncio
import copy
import logging
from urllib.parse import parse_qs, urlencode

import aiohttp
import jsonpatch
import orjson
import yaml
from asgiref.sync import async_to_sync
from django.http import HttpResponse, StreamingHttpResponse
from rest_framework.views import APIView

from . import authz, kube, representation
from .authn import FrontProxyAuthentication, TokenReviewAuthentication
from .authz import NonResourceAttributes, ResourceAttributes, SubjectAccessReviewPermission
from .negotiation import PARTIAL, PARTIAL_LIST, TABLE, PassThroughNegotiation, check_body_type, choose, patch_type
from .resources.kinds import BY_PLURAL, GROUP, MODEL_ARTIFACT, NODE_MODEL_STORE, PUBLIC_VERSION, STORAGE_VERSION
from .status import BadRequest, Forbidden, MethodNotAllowed, NotFound, StatusError, Unauthorized, status_response

log = logging.getLogger(__name__)

FORWARDED_RESPONSE_HEADERS = ("warning",)
# What a PATCH of a v1 NodeModelStore may change: what the garbage collector writes.
NMS_PATCHABLE_METADATA = ("finalizers", "ownerReferences")
NMS_IGNORED_METADATA = ("resourceVersion", "managedFields", "generation")


class KubeAPIView(APIView):
    """Base of every view of the aggregated API: delegated authn/authz, Status errors, no DRF parsing."""

    authentication_classes = [FrontProxyAuthentication, TokenReviewAuthentication]
    permission_classes = [SubjectAccessReviewPermission]
    content_negotiation_class = PassThroughNegotiation
    parser_classes = []

    def get_exception_handler(self):
        from .status import exception_handler

        return exception_handler

    def authorization_attributes(self, request):
        return NonResourceAttributes(request.method.lower(), request.path)

    def permission_denied(self, request, message=None, code=None):
        raise Unauthorized("Unauthorized") if request.user is None else Forbidden(message or "forbidden")


def _query(request) -> dict:
    return {k: v[-1] for k, v in parse_qs(request.META.get("QUERY_STRING", ""), keep_blank_values=True).items()}


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


class ResourceView(KubeAPIView):
    """All verbs on ``/apis/worker.gpustack.ai/v1/[namespaces/<ns>/]<plural>[/<name>[/<subresource>]]``."""

    # --- what the request is -------------------------------------------------------------------------
    def initial(self, request, *args, **kwargs):
        self.kind = BY_PLURAL.get(kwargs.get("plural"))
        self.namespace = kwargs.get("namespace") or ""
        self.name = kwargs.get("name") or ""
        self.subresource = kwargs.get("subresource") or ""
        self.query = _query(request)
        if self.kind is None or (self.namespace and not self.kind.namespaced):
            raise NotFound("the server could not find the requested resource")
        if self.kind.namespaced and not self.namespace and (self.name or request.method not in ("GET", "HEAD")):
            raise NotFound("the server could not find the requested resource")
        super().initial(request, *args, **kwargs)

    @property
    def watching(self) -> bool:
        return _truthy(self.query.get("watch"))

    def verb(self, request) -> str:
        method = request.method
        if method in ("GET", "HEAD"):
            if self.watching:
                return "watch"
            return "get" if self.name else "list"
        if method == "POST":
            return "create"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        if method == "DELETE":
            return "delete" if self.name else "deletecollection"
        return method.lower()

    def authorization_attributes(self, request):
        return ResourceAttributes(
            verb=self.verb(request),
            group=GROUP,
            version=PUBLIC_VERSION,
            resource=self.kind.plural,
            namespace=self.namespace,
            name=self.name,
            subresource=self.subresource,
        )

    def upstream_path(self, name: str | None = None) -> str:
        path = f"/apis/{GROUP}/{STORAGE_VERSION}"
        if self.namespace:
            path += f"/namespaces/{self.namespace}"
        path += f"/{self.kind.plural}"
        name = self.name if name is None else name
        if name:
            path += f"/{name}"
        return path

    # --- dispatch ------------------------------------------------------------------------------------
    def get(self, request, **kwargs):
        return self.handle(request)

    post = put = patch = delete = head = get

    def handle(self, request):
        verb = self.verb(request)
        if request.method == "PATCH":
            self.patch_kind = patch_type(request.content_type)  # 415 before any verb limit
        if self.subresource:
            if self.subresource == "progress" and self.kind is MODEL_ARTIFACT and self.name:
                if verb != "get":
                    raise MethodNotAllowed(f"{verb} is not supported on modelartifacts/progress")
                from .progress import progress_response

                return progress_response(self, request)
            raise NotFound("the server could not find the requested resource")
        if verb not in self.kind.verbs and not (self.kind is NODE_MODEL_STORE and verb == "patch"):
            raise MethodNotAllowed(f'{verb} is not supported on resource "{self.kind.plural}"')
        if verb in ("watch",):
            return self.watch(request)
        if verb in ("get", "list"):
            return self.read(request, verb)
        if verb == "create":
            return self.write(request, "POST", self.body_object(request))
        if verb == "update":
            return self.write(request, "PUT", self.body_object(request))
        if verb == "patch":
            return self.patch_object(request)
        if verb == "delete":
            return self.forward(request, "DELETE", request.body or None, request.content_type or "application/json")
        raise MethodNotAllowed(f"{request.method} is not supported")

    # --- reads ---------------------------------------------------------------------------------------
    def read(self, request, verb: str):
        allowed = (TABLE, PARTIAL_LIST) if verb == "list" else (TABLE, PARTIAL)
        representation_kind = choose(request.META.get("HTTP_ACCEPT"), allowed)
        headers = self.forwarded_headers(request)
        upstream_table = representation_kind == TABLE and self.kind.table_from_fields
        if upstream_table:
            # kube-apiserver renders the raw cells; we only turn them into the v1 columns.
            headers["Accept"] = representation.TABLE_ACCEPT
        resp = kube.worker().request(
            "GET", self.upstream_path(), query=request.META.get("QUERY_STRING", ""), headers=headers
        )
        if resp.status != 200:
            return self.passthrough(resp)
        if upstream_table:
            body = representation.TableConverter(self.kind).table(resp.data)
        elif representation_kind == TABLE:
            body = representation.table_from_objects(
                self.kind,
                resp.data,
                is_list=verb == "list",
                include_object=representation.include_object_policy(self.query),
            )
        elif representation_kind == PARTIAL_LIST:
            body = representation.partial_list_bytes(resp.data)
        elif representation_kind == PARTIAL:
            body = representation.partial_bytes(resp.data)
        else:
            body = representation.public_bytes(resp.data)
        return self.bytes_response(body, resp)

    # --- writes --------------------------------------------------------------------------------------
    def body_object(self, request) -> dict:
        media = check_body_type(request.content_type)
        raw = request.body
        try:
            obj = yaml.safe_load(raw) if media == "application/yaml" else orjson.loads(raw or b"null")
        except (ValueError, yaml.YAMLError) as exc:
            raise BadRequest(f"the body of the request could not be decoded: {exc}") from None
        if not isinstance(obj, dict):
            raise BadRequest("the body of the request must be a JSON object")
        self.check_type(obj)
        return representation.to_storage(obj)

    def check_type(self, obj: dict) -> None:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        expected = f"{GROUP}/{PUBLIC_VERSION}"
        if api_version is not None and api_version != expected:
            raise BadRequest(
                f"the API version in the data ({api_version}) does not match the expected API version ({expected})"
            )
        if kind is not None and kind != self.kind.kind:
            raise BadRequest(f"the kind in the data ({kind}) does not match the expected kind ({self.kind.kind})")

    def write(self, request, method: str, obj: dict):
        if method == "POST":
            self.check_secret_access(request, obj)
        name = None if method == "POST" else self.name
        return self.forward(request, method, orjson.dumps(obj), "application/json", name=name)

    def check_secret_access(self, request, obj: dict) -> None:
        """A create runs as the worker, which may read every Secret: the caller must be able to read the
        Secret it names, or it could borrow a token it cannot see."""
        if self.kind is not MODEL_ARTIFACT:
            return
        source = ((obj.get("spec") or {}).get("source") or {}) if isinstance(obj.get("spec"), dict) else {}
        for member in ("huggingFace", "modelScope"):
            ref = (source.get(member) or {}).get("secretRef") if isinstance(source.get(member), dict) else None
            if isinstance(ref, dict) and ref.get("name"):
                attrs = ResourceAttributes("get", "", "v1", "secrets", self.namespace, ref["name"])
                allowed, reason = authz.review(request.user, attrs)
                if not allowed:
                    raise Forbidden(
                        f'modelartifacts "{obj.get("metadata", {}).get("name", "")}" is forbidden: '
                        f'User "{request.user.username}" cannot get resource "secrets" in API group "" in the '
                        f'namespace "{self.namespace}", so it cannot name Secret "{ref["name"]}" in spec.source.'
                        f"{member}.secretRef",
                        details={
                            "group": GROUP,
                            "kind": "modelartifacts",
                            "causes": [
                                {"reason": "FieldValueForbidden", "field": f"spec.source.{member}.secretRef.name"}
                            ],
                        },
                    )

    def patch_object(self, request):
        kind = self.patch_kind
        raw = request.body
        try:
            if kind == "apply":
                body = yaml.safe_load(raw)
            else:
                body = orjson.loads(raw or b"null")
        except (ValueError, yaml.YAMLError) as exc:
            raise BadRequest(f"the body of the request could not be decoded: {exc}") from None
        if kind in ("merge", "apply"):
            if not isinstance(body, dict):
                raise BadRequest("a merge or apply patch must be a JSON object")
            if kind == "apply" or "apiVersion" in body or "kind" in body:
                self.check_type(body)
            body = representation.to_storage(body)
            if kind == "apply":
                self.check_secret_access(request, body)
        elif kind == "json":
            if not isinstance(body, list):
                raise BadRequest("a JSON patch must be a JSON array of operations")
            for op in body:
                if (
                    isinstance(op, dict)
                    and op.get("path") == "/apiVersion"
                    and op.get("value") == representation.PUBLIC
                ):
                    op["value"] = representation.STORAGE
        if self.kind is NODE_MODEL_STORE:
            return self.patch_node_model_store(request, kind, body)
        content_type = {
            "json": "application/json-patch+json",
            "merge": "application/merge-patch+json",
            "apply": "application/apply-patch+yaml",
        }[kind]
        return self.forward(request, "PATCH", orjson.dumps(body), content_type)

    def patch_node_model_store(self, request, kind: str, patch):
        """NodeModelStores take only what the garbage collector writes: finalizers and ownerReferences.

        The patch is applied here to the current object; when nothing else changes, a merge patch of just
        those fields, guarded by the object's resourceVersion, goes to the storage."""
        if kind == "apply":
            raise MethodNotAllowed("nodemodelstores accept no apply patch: the worker owns them")
        current = kube.worker().request("GET", self.upstream_path())
        if current.status != 200:
            return self.passthrough(current)
        before = current.json()
        try:
            if kind == "merge":
                after = merge_patch(copy.deepcopy(before), patch)
            else:
                after = jsonpatch.apply_patch(before, patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, ValueError) as exc:
            raise StatusError(f"the patch could not be applied: {exc}", code=422) from None
        if strip_patchable(after) != strip_patchable(before):
            raise MethodNotAllowed(
                "nodemodelstores can only be read and deleted; a patch may change nothing but "
                "metadata.finalizers and metadata.ownerReferences"
            )
        meta_after = after.get("metadata", {})
        guarded = {"metadata": {"resourceVersion": before["metadata"]["resourceVersion"]}}
        for key in NMS_PATCHABLE_METADATA:
            guarded["metadata"][key] = meta_after.get(key)
        return self.forward(request, "PATCH", orjson.dumps(guarded), "application/merge-patch+json")

    # --- forwarding ----------------------------------------------------------------------------------
    def forwarded_headers(self, request) -> dict:
        headers = {}
        agent = request.META.get("HTTP_USER_AGENT")
        if agent:
            headers["User-Agent"] = agent
        return headers

    def forward(self, request, method: str, body: bytes | None, content_type: str, name: str | None = None):
        headers = self.forwarded_headers(request)
        if body is not None:
            headers["Content-Type"] = content_type
        resp = kube.worker().request(
            method, self.upstream_path(name), query=request.META.get("QUERY_STRING", ""), body=body, headers=headers
        )
        if resp.status >= 300:
            return self.passthrough(resp)
        return self.bytes_response(representation.public_bytes(resp.data), resp)

    def bytes_response(self, body: bytes, upstream: kube.Response) -> HttpResponse:
        response = HttpResponse(body, status=upstream.status, content_type="application/json")
        self.copy_headers(upstream.headers, response)
        return response

    @staticmethod
    def copy_headers(headers, response) -> None:
        for key, value in headers.items():
            if key.lower() in FORWARDED_RESPONSE_HEADERS:
                response[key] = value

    def passthrough(self, resp: kube.Response) -> HttpResponse:
        """An answer from the storage as it came (a Status, usually), at v1 where it names the version."""
        if not resp.data.lstrip().startswith(b"{"):
            return status_response(resp.status if resp.status >= 400 else 502, resp.data.decode(errors="replace")[:500])
        return self.bytes_response(representation.public_bytes(resp.data), resp)

    # --- watch ---------------------------------------------------------------------------------------
    def watch(self, request):
        representation_kind = choose(request.META.get("HTTP_ACCEPT"), (TABLE, PARTIAL))
        query = dict(self.query)
        if self.name:
            query["fieldSelector"] = f"metadata.name={self.name}"
        path = self.upstream_path(name="")
        headers = self.forwarded_headers(request)
        if representation_kind == TABLE and self.kind.table_from_fields:
            headers["Accept"] = representation.TABLE_ACCEPT
        upstream = async_to_sync(open_watch)(path, urlencode(query), headers)
        if upstream.status != 200:
            body = async_to_sync(read_and_close)(upstream)
            return self.passthrough(kube.Response(upstream.status, dict(upstream.headers), body))
        include = representation.include_object_policy(self.query)
        transform = WatchTransform(self.kind, representation_kind, include)
        response = StreamingHttpResponse(stream_events(upstream, transform), content_type="application/json")
        response["Cache-Control"] = "no-cache, private"
        return response


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


def strip_patchable(obj: dict) -> dict:
    out = copy.deepcopy(obj)
    metadata = out.get("metadata") or {}
    for key in NMS_PATCHABLE_METADATA + NMS_IGNORED_METADATA:
        metadata.pop(key, None)
    return out


# --- watch streaming (on the event loop; no thread is held while a watch is open) ----------------------


async def open_watch(path: str, query: str, headers: dict):
    client = kube.worker()
    session = client.async_session()
    return await session.get(
        client.url(path, query),
        headers={"Accept": "application/json", **client.auth_headers(), **headers},  # headers may ask for a Table
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None),
    )


async def read_and_close(upstream) -> bytes:
    try:
        return await upstream.read()
    finally:
        upstream.release()


class WatchTransform:
    """Turns one upstream watch event line into the line the client asked for."""

    def __init__(self, kind, representation_kind: str, include_object: str):
        self.kind = kind
        self.representation_kind = representation_kind
        self.include_object = include_object
        self.first = True
        self.converter = representation.TableConverter(kind) if kind.table_from_fields else None

    def __call__(self, line: bytes) -> bytes:
        if self.representation_kind == TABLE:
            if self.converter is not None:
                out = self.converter.event(line, with_columns=self.first)
            else:
                out = representation.object_table_event(self.kind, line, self.include_object, with_columns=self.first)
            self.first = False
            return out
        if self.representation_kind == PARTIAL:
            return representation.partial_event_bytes(line)
        return representation.public_bytes(line)


async def stream_events(upstream, transform: WatchTransform):
    """Relay newline-delimited watch events, transformed, until either side ends."""
    buffer = b""
    try:
        async for chunk in upstream.content.iter_any():
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield transform(line) + b"\n"
        if buffer.strip():
            yield transform(buffer) + b"\n"
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        # The upstream connection broke: end the watch; the client watches again from its last version.
        log.info("watch stream from kube-apiserver ended: %s", exc)
    except Exception:
        log.exception("watch stream failed")
    finally:
        upstream.release()
        upstream.close()
