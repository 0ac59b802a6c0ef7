"""The public ``worker.gpustack.ai/v1`` resources, carried out on the v1alpha1 storage CRDs.

Each request is authenticated (front proxy or token), authorized with a SubjectAccessReview for the
caller, checked against the v1 verb limits, then sent to kube-apiserver with the service's identity.
Query parameters, DeleteOptions bodies and content types pass through; apiVersion is rewritten both
ways. Reads always go to kube-apiserver: a read after a write sees the new resourceVersion.

Verb limits of v1 (checked in this order, after authorization):
  strategic merge patch               415 (clients fall back to merge patch on 415 only)
  .../<name>/status                   404 (v1 has no status subresource: the service owns status)
  .../<name>/progress                 get only (a watch is 405): ``progress.ProgressView``
  collection DELETE                   405
  nodemodelstores create/update       405; PATCH only of metadata.finalizers and ownerReferences
"""

from __future__ import annotations

import orjson
from rest_framework.response import Response

from gpustack_models import kube
from gpustack_models.api import authorization, patches
from gpustack_models.api.authorization import ResourceAttributes
from gpustack_models.api.conversion import PUBLIC, STORAGE, to_storage
from gpustack_models.api.negotiation import media_type
from gpustack_models.api.parsers import OBJECT_PARSERS, PATCH_PARSERS, PATCH_TYPES
from gpustack_models.api.renderers import LIST_RENDERERS, OBJECT_RENDERERS, StorageAnswer
from gpustack_models.api.status import not_found
from gpustack_models.api.streaming import relay
from gpustack_models.api.targets import Query, Target
from gpustack_models.api.verbs import request_verb
from gpustack_models.api.views import KubeAPIView
from gpustack_models.kinds import GROUP, MODEL_ARTIFACT, NODE_MODEL_STORE, PUBLIC_VERSION
from gpustack_models.kube.errors import BadRequest, Forbidden, MethodNotAllowed
from gpustack_models.models import Prefetch

FORWARDED_RESPONSE_HEADERS = ("warning",)
PATCH_CONTENT_TYPES = {parser.patch_type: parser.media_type for parser in PATCH_PARSERS}


class ResourceView(KubeAPIView):
    """All verbs on ``/apis/worker.gpustack.ai/v1/[namespaces/<ns>/]<plural>[/<name>]``."""

    # --- what the request is -------------------------------------------------------------------------
    def initial(self, request, *args, **kwargs):
        self.target = Target.from_url(kwargs, request.method)
        self.kind = self.target.kind
        self.query = Query.of(request)
        super().initial(request, *args, **kwargs)

    @property
    def watching(self) -> bool:
        return self.query.watch

    def verb(self, request) -> str:
        return request_verb(request.method, bool(self.target.name), self.watching)

    def authorization_attributes(self, request):
        return ResourceAttributes(
            verb=self.verb(request),
            group=GROUP,
            version=PUBLIC_VERSION,
            resource=self.kind.plural,
            namespace=self.target.namespace,
            name=self.target.name,
        )

    def get_parsers(self):
        classes = PATCH_PARSERS if self.request.method == "PATCH" else OBJECT_PARSERS
        return [parser() for parser in classes]

    def get_renderers(self):
        # A watch's events are single objects, as a get's: the garbage collector's metadata informer watches a
        # collection with as=PartialObjectMetadata (and cannot decode anything else).
        watching = getattr(self, "query", None) is not None and self.request.method == "GET" and self.watching
        single = bool(self.kwargs.get("name")) or watching
        return [renderer() for renderer in (OBJECT_RENDERERS if single else LIST_RENDERERS)]

    def allow(self, verb: str) -> None:
        if verb not in self.kind.verbs:
            raise MethodNotAllowed(f'{verb} is not supported on resource "{self.kind.plural}"')

    # --- reads ---------------------------------------------------------------------------------------
    def get(self, request, **kwargs):
        verb = self.verb(request)
        self.allow(verb)
        if verb == "watch":
            return self.watch(request)
        renderer = request.accepted_renderer
        headers = self.forwarded_headers(request)
        upstream_accept = renderer.upstream_accept(self.kind)
        if upstream_accept:
            # kube-apiserver renders the raw cells; the renderer only turns them into the v1 columns.
            headers["Accept"] = upstream_accept
        answer = self.upstream("GET", self.target.storage_path(), headers=headers)
        body = StorageAnswer(answer.data, is_list=verb == "list", is_table=bool(upstream_accept))
        return self.respond(body, answer)

    def watch(self, request):
        resource_version = self.query.get("resourceVersion")
        if resource_version and not (resource_version.isascii() and resource_version.isdigit()):  # not "¹"
            # kube-apiserver answers such a watch of a CRD with a 500; a client's mistake is a 400.
            raise BadRequest(f'resourceVersion: Invalid value: "{resource_version}": must be an unsigned integer')
        named = {"fieldSelector": f"metadata.name={self.target.name}"} if self.target.name else {}
        renderer = request.accepted_renderer
        headers = self.forwarded_headers(request)
        upstream_accept = renderer.upstream_accept(self.kind)
        if upstream_accept:
            headers["Accept"] = upstream_accept
        query = self.query.upstream(watch=True, **named)
        return relay(self.target.storage_path(name=""), query, headers, renderer.watch_transform(self))

    # --- writes --------------------------------------------------------------------------------------
    def post(self, request, **kwargs):
        self.allow("create")
        obj = self.object_body(request)
        self.check_secret_access(request, obj)
        return self.forward(request, "POST", orjson.dumps(obj), "application/json", name="")

    def put(self, request, **kwargs):
        self.allow("update")
        obj = self.object_body(request)
        return self.forward(request, "PUT", orjson.dumps(obj), "application/json")

    def patch(self, request, **kwargs):
        body = request.data  # 415 for a body type no patch parser takes, before any verb limit
        patch_type = PATCH_TYPES[media_type(request.content_type)]
        if self.kind is NODE_MODEL_STORE:
            return self.patch_node_model_store(request, patch_type, body)
        self.allow("patch")
        body = self.storage_patch(request, patch_type, body)
        return self.forward(request, "PATCH", orjson.dumps(body), PATCH_CONTENT_TYPES[patch_type])

    def delete(self, request, **kwargs):
        self.allow(self.verb(request))
        response = self.forward(request, "DELETE", request.body or None, request.content_type or "application/json")
        if self.kind is MODEL_ARTIFACT and self.target.name and self.may_list_prefetches(request):
            said = referenced_by_prefetches(self.target.namespace, self.target.name)
            if said:  # kubectl prints it as "Warning: ..."
                response["Warning"] = ", ".join(filter(None, [response.get("Warning"), warning(said)]))
        return response

    def may_list_prefetches(self, request) -> bool:
        """The delete warning names prefetches: only to a caller who may list them in the namespace."""
        attrs = ResourceAttributes("list", GROUP, PUBLIC_VERSION, "modelprefetches", self.target.namespace)
        return authorization.review(request.user, attrs)[0]

    def object_body(self, request) -> dict:
        """The body of a create or update, checked against this resource and rewritten to the storage."""
        if request.stream is None:
            raise BadRequest("the body of the request must be a JSON object")
        obj = request.data
        self.check_type(obj)
        return to_storage(obj)

    def storage_patch(self, request, patch_type: str, body):
        """A merge, apply or JSON patch of a v1 object as a patch of the storage object."""
        if patch_type == "json":
            for op in body:
                if isinstance(op, dict) and op.get("path") == "/apiVersion" and op.get("value") == PUBLIC:
                    op["value"] = STORAGE
            return body
        if patch_type == "apply" or "apiVersion" in body or "kind" in body:
            self.check_type(body)
        body = to_storage(body)
        if patch_type == "apply":
            self.check_secret_access(request, body)  # an apply may create
        return body

    def check_type(self, obj: dict) -> None:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        expected = f"{GROUP}/{PUBLIC_VERSION}"
        if api_version is not None and api_version != expected:
            raise BadRequest(
                f"the API version in the data ({api_version}) does not match the expected API version ({expected})"
            )
        if kind is not None and kind != self.kind.kind:
            raise BadRequest(f"the kind in the data ({kind}) does not match the expected kind ({self.kind.kind})")

    def check_secret_access(self, request, obj: dict) -> None:
        """A create runs as the service, which may read every Secret: the caller must be able to read the
        Secret it names, or it could borrow a token it cannot see."""
        if self.kind is not MODEL_ARTIFACT:
            return
        for member, secret in secret_refs(obj):
            attrs = ResourceAttributes("get", "", "v1", "secrets", self.target.namespace, secret)
            allowed, _reason = authorization.review(request.user, attrs)
            if not allowed:
                raise secret_denied(request.user, self.target.namespace, obj, member, secret)

    def patch_node_model_store(self, request, patch_type: str, patch):
        """NodeModelStores take only what the garbage collector writes (``patches``)."""
        before = self.upstream("GET", self.target.storage_path()).json()
        guarded = patches.garbage_collector_patch(before, patch_type, patch)
        return self.forward(request, "PATCH", orjson.dumps(guarded), "application/merge-patch+json")

    # --- forwarding ----------------------------------------------------------------------------------
    def forwarded_headers(self, request) -> dict:
        agent = request.META.get("HTTP_USER_AGENT")
        return {"User-Agent": agent} if agent else {}

    def upstream(self, method: str, path: str, **kwargs) -> kube.KubeResponse:
        """The storage's answer to this request's query; its ``StatusError`` unless it succeeded."""
        kwargs.setdefault("query", self.query.upstream(watch=False))
        return kube.default().request(method, path, **kwargs).raise_for_status()

    def forward(self, request, method: str, body: bytes | None, content_type: str, name: str | None = None):
        headers = self.forwarded_headers(request)
        if body is not None:
            headers["Content-Type"] = content_type
        answer = self.upstream(method, self.target.storage_path(name), body=body, headers=headers)
        return self.respond(StorageAnswer(answer.data), answer)

    def respond(self, body: StorageAnswer, answer: kube.KubeResponse) -> Response:
        response = Response(body, status=answer.status)
        for key, value in answer.headers.items():
            if key.lower() in FORWARDED_RESPONSE_HEADERS:
                response[key] = value
        return response


class SubresourceView(KubeAPIView):
    """``.../<name>/<subresource>`` other than ``progress``: v1 has none (the service owns status)."""

    def initial(self, request, *args, **kwargs):
        self.target = Target.from_url(kwargs, "GET")
        super().initial(request, *args, **kwargs)

    def authorization_attributes(self, request):
        return ResourceAttributes(
            verb=request_verb(request.method, True, Query.of(request).watch),
            group=GROUP,
            version=PUBLIC_VERSION,
            resource=self.target.kind.plural,
            namespace=self.target.namespace,
            name=self.target.name,
            subresource=self.kwargs.get("subresource") or "",
        )

    def http_method_not_allowed(self, request, *args, **kwargs):
        raise not_found()

    get = post = put = patch = delete = http_method_not_allowed


def warning(text: str) -> str:
    """A ``Warning`` header value (RFC 7234, as kube-apiserver writes its own: code 299, agent ``-``)."""
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def referenced_by_prefetches(namespace: str, name: str) -> str:
    """What a person deleting an artifact should know: the prefetches that name it hold nothing until an
    artifact of that name exists again (empty when none does)."""
    prefetches = Prefetch.objects.live().filter(namespace=namespace, artifact_name=name)
    rows = sorted(prefetches.values_list("name", "pinned")[:11])
    if not rows:
        return ""
    listed = ", ".join(f"{n} (pinned)" if pinned else n for n, pinned in rows[:10])
    more = " and more" if len(rows) > 10 else ""
    one = len(rows) == 1
    noun, verb, they = ("ModelPrefetch", "names", "it holds") if one else ("ModelPrefetches", "name", "they hold")
    return (
        f"{noun} {listed}{more} in {namespace} {verb} this ModelArtifact: {they} nothing on the nodes until a "
        f"ModelArtifact {name} exists again"
    )


def secret_refs(obj: dict):
    """``(member, Secret name)`` of each hub or registry source of an artifact body that names a Secret."""
    spec = obj.get("spec")
    source = (spec.get("source") or {}) if isinstance(spec, dict) else {}
    for member in ("huggingFace", "modelScope", "oci", "s3"):
        value = source.get(member) if isinstance(source, dict) else None
        ref = value.get("secretRef") if isinstance(value, dict) else None
        if isinstance(ref, dict) and ref.get("name"):
            yield member, ref["name"]


def secret_denied(user, namespace: str, obj: dict, member: str, secret: str) -> Forbidden:
    name = (obj.get("metadata") or {}).get("name", "")
    return Forbidden(
        f'modelartifacts "{name}" is forbidden: User "{user.username}" cannot get resource "secrets" in API '
        f'group "" in the namespace "{namespace}", so it cannot name Secret "{secret}" in '
        f"spec.source.{member}.secretRef",
        details={
            "group": GROUP,
            "kind": "modelartifacts",
            "causes": [{"reason": "FieldValueForbidden", "field": f"spec.source.{member}.secretRef.name"}],
        },
    )
