"""URLs by process role: the aggregated API (``GPUSTACK_SERVER_ROLE=api``) routes the API and the plugins'
tickets and nothing else; the admin console (``console``) routes the console and health, never the API."""

from django.conf import settings
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from gpustack_models.api import health

if settings.SERVER_ROLE == "api":
    urlpatterns = [
        path("", include("gpustack_models.api.urls")),
        path("", include("gpustack_models.internal.urls")),
        path("", include("gpustack_models.webhooks.urls")),
    ]
else:
    urlpatterns = [
        # Browsers ask for /favicon.ico whatever the page links: the console's icon, not a 404.
        path("favicon.ico", RedirectView.as_view(url=static("console/favicon.svg"), permanent=True)),
        path("healthz", health.health),
        path("livez", health.health),
        path("readyz", health.health),
        path("admin/", admin.site.urls),
    ]
