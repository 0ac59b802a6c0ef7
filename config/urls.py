"""URLs by process role: the aggregated API (``GPUSTACK_SERVER_ROLE=api``) and the admin console."""

from django.conf import settings
from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("", include("gpustack_models.api.urls"))]

if settings.SERVER_ROLE == "console":
    urlpatterns.append(path("admin/", admin.site.urls))
