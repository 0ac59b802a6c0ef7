"""The routes the node plugins call on the API process."""

from django.urls import path

from gpustack_models.api.server import threaded
from gpustack_models.internal import certificates, mounts, tickets

urlpatterns = [
    path("internal/v1/tickets", threaded(tickets.TicketView.as_view(), "/internal/v1/tickets")),
    path("internal/v1/mounts", threaded(mounts.MountView.as_view(), "/internal/v1/mounts")),
    path("internal/v1/mounts/release", threaded(mounts.ReleaseView.as_view(), "/internal/v1/mounts/release")),
    path(
        "internal/v1/plugin-certificates",
        threaded(certificates.PluginCertificateView.as_view(), "/internal/v1/plugin-certificates"),
    ),
]
