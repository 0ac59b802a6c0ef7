"""The route kube-apiserver calls for the placement webhook."""

from django.urls import path

from gpustack_models.api.server import threaded
from gpustack_models.webhooks import placement

urlpatterns = [
    path("internal/v1/placement", threaded(placement.PlacementView.as_view(), "/internal/v1/placement")),
]
