"""Discovery, OpenAPI and health endpoints of the aggregated API server."""

from __future__ import annotations

import json

from django.http import HttpResponse

from . import discovery
from .facade import KubeAPIView
from .status import NotAcceptable, NotFound


def _json(obj, status=200) -> HttpResponse:
    return HttpResponse(json.dumps(obj), status=status, content_type="application/json")


class APIsView(KubeAPIView):
    """``/apis``: the aggregated-discovery form answers 406 so kube-apiserver falls back to the
    per-version document; plain JSON gets the APIGroupList."""

    def get(self, request):
        if discovery.wants_aggregated_discovery(request.META.get("HTTP_ACCEPT")):
            raise NotAcceptable("aggregated discovery is not served; use /apis/worker.gpustack.ai/v1")
        return _json(discovery.api_group_list())


class GroupView(KubeAPIView):
    def get(self, request):
        return _json(discovery.api_group())


class VersionView(KubeAPIView):
    def get(self, request):
        return _json(discovery.api_resource_list())


class OpenAPIV2View(KubeAPIView):
    def get(self, request):
        body, etag = discovery.openapi_v2()
        if request.META.get("HTTP_IF_NONE_MATCH") == etag:
            response = HttpResponse(status=304)
        else:
            response = HttpResponse(body, content_type="application/json")
        response["ETag"] = etag
        response["Cache-Control"] = "no-cache, private"
        return response


class OpenAPIV3View(KubeAPIView):
    """Not served: kube-apiserver then converts our v2 document to v3 itself."""

    def get(self, request, rest=""):
        raise NotFound("the server could not find the requested resource")


async def health(request):
    return HttpResponse("ok", content_type="text/plain")
