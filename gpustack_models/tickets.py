"""Fetch tickets: what a node plugin needs to download a digest (source, endpoint, repository, commit,
the manifest's files and the hub token, if any).

Answered only to a plugin whose Pod-bound ServiceAccount token is bound to the node it names (TokenReview:
the plugin's ServiceAccount and ``authentication.kubernetes.io/node-name``), and only for a digest in that
node's ``spec.models`` (read live from kube-apiserver). Not part of the aggregated API: plugins call the
worker's Service directly.
"""

from __future__ import annotations

import base64
import json

from django.conf import settings
from django.http import HttpResponse
from rest_framework.permissions import BasePermission

from . import kube
from .authn import TokenReviewAuthentication
from .facade import KubeAPIView
from .manifests import NODE_NAME_EXTRA, sa_user
from .models import Resolution
from .resources.kinds import GROUP, STORAGE_VERSION
from .status import BadRequest, Forbidden, NotFound, StatusError, Unauthorized


class BoundPlugin(BasePermission):
    def has_permission(self, request, view) -> bool:
        user = request.user
        if user is None:
            raise Unauthorized("Unauthorized")
        if user.username != sa_user(settings.PLUGIN_SERVICE_ACCOUNT):
            raise Forbidden(f'User "{user.username}" is not the node plugin')
        return True


class TicketView(KubeAPIView):
    authentication_classes = [TokenReviewAuthentication]
    permission_classes = [BoundPlugin]

    def post(self, request):
        try:
            body = json.loads(request.body or b"{}")
            node, digest = body["node"], body["digest"]
        except (ValueError, KeyError, TypeError):
            raise BadRequest("expected a JSON body {node, digest}") from None
        bound = request.user.extra_dict.get(NODE_NAME_EXTRA) or []
        if bound != [node]:
            raise Forbidden(f"this token is bound to node {bound[0] if bound else '(none)'}, not {node}")
        try:
            store = kube.worker().get(f"/apis/{GROUP}/{STORAGE_VERSION}/nodemodelstores/{node}")
        except kube.KubeError as exc:
            if exc.status == 404:
                raise NotFound(f"no NodeModelStore for node {node}") from None
            raise
        wanted = {m.get("digest") for m in (store.get("spec") or {}).get("models") or []}
        if digest not in wanted:
            raise Forbidden(f"{digest} is not in the spec.models of node {node}")
        resolution = self.resolution(digest)
        if resolution is None:
            raise StatusError(f"no resolved artifact provides {digest} yet", code=409, reason="Conflict")
        manifest = resolution.manifest
        ticket = {
            "digest": digest,
            "source": resolution.source,
            "endpoint": resolution.endpoint,
            "repository": resolution.repository,
            "commit": resolution.commit,
            "files": manifest.files,
            "proxy": settings.HUB_PROXY or None,
            "token": self.hub_token(resolution),
        }
        return HttpResponse(json.dumps(ticket), content_type="application/json")

    @staticmethod
    def resolution(digest: str) -> Resolution | None:
        """A resolution of some live artifact with this content (any will do: the digest names the
        files, whoever asked for them)."""
        return (
            Resolution.objects.select_related("manifest", "artifact")
            .filter(manifest_id=digest, artifact__deleted=False, artifact__digest=digest)
            .order_by("secret_name", "-resolved_at")  # prefer one that needs no token
            .first()
        )

    @staticmethod
    def hub_token(resolution: Resolution) -> str | None:
        if not resolution.secret_name:
            return None
        try:
            secret = kube.worker().get(
                f"/api/v1/namespaces/{resolution.artifact.namespace}/secrets/{resolution.secret_name}"
            )
        except kube.KubeError:
            return None
        raw = (secret.get("data") or {}).get("token")
        return base64.b64decode(raw).decode().strip() if raw else None
