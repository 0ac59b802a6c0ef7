"""The base of every view of the aggregated API.

DRF does the plumbing: the authentication classes (front proxy, bearer token), a permission class that
asks kube-apiserver with a SubjectAccessReview, parsers for the body types, renderers chosen by
``KubeContentNegotiation``, and one exception handler turning every error into a ``Status``. A view
says what a request is in Kubernetes terms through ``authorization_attributes``.
"""

from __future__ import annotations

from django.http import HttpResponse
from rest_framework.views import APIView

from gpustack_models.api import api_metrics
from gpustack_models.api.authentication import FrontProxyAuthentication, TokenReviewAuthentication
from gpustack_models.api.authorization import NonResourceAttributes, SubjectAccessReviewPermission
from gpustack_models.api.negotiation import JSONOnlyNegotiation, KubeContentNegotiation
from gpustack_models.api.parsers import OBJECT_PARSERS
from gpustack_models.api.renderers import ObjectRenderer
from gpustack_models.api.status import exception_handler
from gpustack_models.kube.errors import Forbidden, Unauthorized


class KubeAPIView(APIView):
    """Delegated authentication and authorization, kube-apiserver's negotiation, ``Status`` errors."""

    authentication_classes = [FrontProxyAuthentication, TokenReviewAuthentication]
    permission_classes = [SubjectAccessReviewPermission]
    content_negotiation_class = KubeContentNegotiation
    parser_classes = list(OBJECT_PARSERS)
    renderer_classes = [ObjectRenderer]
    http_method_names = ["get", "post", "put", "patch", "delete", "head"]  # no OPTIONS metadata

    def get_exception_handler(self):
        return exception_handler

    def initial(self, request, *args, **kwargs):
        """Authenticate and authorize before negotiating: an unauthorized caller learns nothing else.

        (DRF negotiates first; versioning and throttling are not used here.)"""
        self.format_kwarg = None
        self.perform_authentication(request)
        self.check_permissions(request)
        request.accepted_renderer, request.accepted_media_type = self.perform_content_negotiation(request)

    def authorization_attributes(self, request):
        return NonResourceAttributes(request.method.lower(), request.path)

    def permission_denied(self, request, message=None, code=None):
        raise Unauthorized("Unauthorized") if request.user is None else Forbidden(message or "forbidden")


class MetricsView(KubeAPIView):
    """``GET /metrics`` (``api_metrics``): for authenticated callers allowed ``get`` on the non-resource URL
    ``/metrics``, as kube components serve theirs."""

    content_negotiation_class = JSONOnlyNegotiation  # errors are Status objects, whatever Accept says
    http_method_names = ["get", "head"]

    def authorization_attributes(self, request):
        return NonResourceAttributes("get", "/metrics")

    def get(self, request):
        body, content_type = api_metrics.exposition()
        return HttpResponse(body, content_type=content_type)
