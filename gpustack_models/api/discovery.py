"""Discovery of ``worker.gpustack.ai/v1``, from the kind definitions.

kube-apiserver answers ``/apis`` and ``/apis/worker.gpustack.ai`` itself and proxies
``/apis/worker.gpustack.ai/v1`` to us (and probes it every 30 s: while it fails, every proxied request
answers 503). The aggregated-discovery form of ``/apis`` answers 406, so kube-apiserver falls back to the
``APIResourceList`` of ``/apis/worker.gpustack.ai/v1``.
"""

from __future__ import annotations

import hashlib

from rest_framework.response import Response

from gpustack_models.api.negotiation import JSONOnlyNegotiation, wants_aggregated_discovery
from gpustack_models.api.views import KubeAPIView
from gpustack_models.kinds import GROUP, KINDS, PUBLIC_VERSION
from gpustack_models.kube.errors import NotAcceptable

GROUP_VERSION = f"{GROUP}/{PUBLIC_VERSION}"


def api_resource_list() -> dict:
    resources = []
    for kind in KINDS:
        resources.append(
            {
                "name": kind.plural,
                "singularName": kind.singular,
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": sorted(kind.verbs),
                "shortNames": list(kind.short_names),
                "categories": list(kind.categories),
                "storageVersionHash": hashlib.sha256(f"{GROUP}/{kind.plural}".encode()).hexdigest()[:12],
            }
        )
        for sub, sub_kind, verbs in kind.subresources:
            resources.append(
                {
                    "name": f"{kind.plural}/{sub}",
                    "singularName": "",
                    "namespaced": kind.namespaced,
                    "kind": sub_kind,
                    "verbs": list(verbs),
                }
            )
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION, "resources": resources}


def api_group() -> dict:
    version = {"groupVersion": GROUP_VERSION, "version": PUBLIC_VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [version], "preferredVersion": version}


def api_group_list() -> dict:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]}


class APIsView(KubeAPIView):
    """``/apis``: the aggregated-discovery form answers 406 so kube-apiserver falls back to the
    per-version document; plain JSON gets the APIGroupList."""

    content_negotiation_class = JSONOnlyNegotiation

    def get(self, request):
        if wants_aggregated_discovery(request.META.get("HTTP_ACCEPT")):
            raise NotAcceptable("aggregated discovery is not served; use /apis/worker.gpustack.ai/v1")
        return Response(api_group_list())


class GroupView(KubeAPIView):
    content_negotiation_class = JSONOnlyNegotiation

    def get(self, request):
        return Response(api_group())


class VersionView(KubeAPIView):
    content_negotiation_class = JSONOnlyNegotiation

    def get(self, request):
        return Response(api_resource_list())
