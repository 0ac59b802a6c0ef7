"""The routes of the ``worker.gpustack.ai/v1`` group, discovery, OpenAPI, health and metrics on the API process
(``manage.py runapiserver``; ``config.urls`` adds the plugins' and the webhook's)."""

from django.urls import path, re_path

from gpustack_models.api import discovery, files, health, openapi, progress, resources, views
from gpustack_models.api.server import threaded

GROUP = r"apis/worker\.gpustack\.ai"
NAMESPACE = r"namespaces/(?P<namespace>[^/]+)/"
RESOURCE = rf"^{GROUP}/v1/(?:{NAMESPACE})?(?P<plural>[^/]+)"

urlpatterns = [
    path("healthz", health.health),
    path("livez", health.health),
    path("readyz", health.health),
    path("apis", threaded(discovery.APIsView.as_view(), "/apis")),
    re_path(rf"^{GROUP}/?$", threaded(discovery.GroupView.as_view(), "/apis/worker.gpustack.ai")),
    re_path(rf"^{GROUP}/v1/?$", threaded(discovery.VersionView.as_view(), "/apis/worker.gpustack.ai/v1")),
    re_path(
        rf"^{GROUP}/v1/{NAMESPACE}modelartifacts/(?P<name>[^/]+)/progress/?$",
        threaded(progress.ProgressView.as_view(), "modelartifacts/progress"),
    ),
    re_path(
        rf"^{GROUP}/v1/{NAMESPACE}modelartifacts/(?P<name>[^/]+)/files/?$",
        threaded(files.FilesView.as_view(), "modelartifacts/files"),
    ),
    re_path(rf"{RESOURCE}(?:/(?P<name>[^/]+))?/?$", threaded(resources.ResourceView.as_view())),
    re_path(rf"{RESOURCE}/(?P<name>[^/]+)/(?P<subresource>[^/]+)/?$", threaded(resources.SubresourceView.as_view())),
    path("openapi/v2", threaded(openapi.OpenAPIV2View.as_view(), "/openapi/v2")),
    re_path(r"^openapi/v3(?P<rest>/.*)?$", threaded(openapi.OpenAPIV3View.as_view(), "/openapi/v3")),
    path("metrics", threaded(views.MetricsView.as_view(), "/metrics")),
]
