from django.conf import settings
from django.contrib import admin
from django.urls import path, re_path

from gpustack_models import facade, tickets, views
from gpustack_models.server import threaded

GROUP = r"apis/worker\.gpustack\.ai"

urlpatterns = [
    path("healthz", views.health),
    path("livez", views.health),
    path("readyz", views.health),
    path("apis", threaded(views.APIsView.as_view())),
    re_path(rf"^{GROUP}/?$", threaded(views.GroupView.as_view())),
    re_path(rf"^{GROUP}/v1/?$", threaded(views.VersionView.as_view())),
    re_path(
        rf"^{GROUP}/v1/(?:namespaces/(?P<namespace>[^/]+)/)?(?P<plural>[^/]+)"
        r"(?:/(?P<name>[^/]+))?(?:/(?P<subresource>[^/]+))?/?$",
        threaded(facade.ResourceView.as_view()),
    ),
    path("openapi/v2", threaded(views.OpenAPIV2View.as_view())),
    path("internal/v1/tickets", threaded(tickets.TicketView.as_view())),
    re_path(r"^openapi/v3(?P<rest>/.*)?$", threaded(views.OpenAPIV3View.as_view())),
]

if settings.SERVER_ROLE == "console":
    urlpatterns.append(path("admin/", admin.site.urls))
