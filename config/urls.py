from django.contrib import admin
from django.urls import path, re_path

from gpustack_models import facade, views

GROUP = r"apis/worker\.gpustack\.ai"

urlpatterns = [
    path("healthz", views.health),
    path("livez", views.health),
    path("readyz", views.health),
    path("apis", views.APIsView.as_view()),
    re_path(rf"^{GROUP}/?$", views.GroupView.as_view()),
    re_path(rf"^{GROUP}/v1/?$", views.VersionView.as_view()),
    re_path(
        rf"^{GROUP}/v1/(?:namespaces/(?P<namespace>[^/]+)/)?(?P<plural>[^/]+)"
        r"(?:/(?P<name>[^/]+))?(?:/(?P<subresource>[^/]+))?/?$",
        facade.ResourceView.as_view(),
    ),
    path("openapi/v2", views.OpenAPIV2View.as_view()),
    re_path(r"^openapi/v3(?P<rest>/.*)?$", views.OpenAPIV3View.as_view()),
    path("admin/", admin.site.urls),
]
