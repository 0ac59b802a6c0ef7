"""The routes kube-apiserver calls for the webhooks: placement, and the model volumes' warnings."""

from django.urls import path

from gpustack_models.api.server import threaded
from gpustack_models.webhooks import placement, volume_warnings

urlpatterns = [
    path("internal/v1/placement", threaded(placement.PlacementView.as_view(), "/internal/v1/placement")),
    path("internal/v1/volumes", threaded(volume_warnings.VolumeWarningsView.as_view(), "/internal/v1/volumes")),
]
