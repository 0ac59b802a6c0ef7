"""Fetch tickets: what a node plugin needs to download a digest (source, endpoint, repository, commit,
the manifest's files and the hub token, if any).

Answered only to a plugin whose Pod-bound ServiceAccount token is bound to the node it names (TokenReview:
the plugin's ServiceAccount and ``authentication.kubernetes.io/node-name``), and only for a digest in that
node's ``spec.models`` (read live from kube-apiserver). Not part of the aggregated API: plugins call the
worker's Service directly.
"""

from __future__ import annotations

import base64

from django.conf import settings
from rest_framework.permissions import BasePermission
from rest_framework.response import Response

from gpustack_models import kube
from gpustack_models.kinds import GROUP, STORAGE_VERSION
from gpustack_models.kube.errors import BadRequest, Conflict, Forbidden, NotFound, Unauthorized
from gpustack_models.kube.identity import NODE_NAME_EXTRA, plugin_user
from gpustack_models.models import Resolution

from .authentication import TokenReviewAuthentication
from .views import KubeAPIView


class BoundPlugin(BasePermission):
    def has_permission(self, request, view) -> bool:
        user = request.user
        if user is None:
            raise Unauthorized("Unauthorized")
        if user.username != plugin_user():
            raise Forbidden(f'User "{user.username}" is not the node plugin')
        return True


class TicketView(KubeAPIView):
    authentication_classes = [TokenReviewAuthentication]
    permission_classes = [BoundPlugin]

    def post(self, request):
        body = request.data
        node, digest = body.get("node"), body.get("digest")
        if not isinstance(node, str) or not isinstance(digest, str):
            raise BadRequest("expected a JSON body {node, digest}")
        bound = request.user.extra_dict.get(NODE_NAME_EXTRA) or []
        if bound != [node]:
            raise Forbidden(f"this token is bound to node {bound[0] if bound else '(none)'}, not {node}")
        try:
            store = kube.worker().get(f"/apis/{GROUP}/{STORAGE_VERSION}/nodemodelstores/{node}")
        except kube.NotFound:
            raise NotFound(f"no NodeModelStore for node {node}") from None
        wanted = {m.get("digest") for m in (store.get("spec") or {}).get("models") or []}
        if digest not in wanted:
            raise Forbidden(f"{digest} is not in the spec.models of node {node}")
        resolution = self.resolution(digest)
        if resolution is None:
            raise Conflict(f"no resolved artifact provides {digest} yet")
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
        return Response(ticket)

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
        except kube.StatusError:
            return None
        raw = (secret.get("data") or {}).get("token")
        return base64.b64decode(raw).decode().strip() if raw else None
