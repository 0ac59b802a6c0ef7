import logging

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpustack_models.plugin.csi.registration import SocketPathError, check_socket_path, registration_socket
from gpustack_models.plugin.node.agent import Plugin, PluginSettings
from gpustack_models.stop_signals import on_stop_signals


class Command(BaseCommand):
    help = "The node plugin: hold the digests this node's NodeModelStore lists, report them, serve live bytes."

    def add_arguments(self, parser):
        parser.add_argument("--node", required=True, help="the node this plugin runs on (its NodeModelStore's name)")

    def handle(self, *args, node, **options):
        logging.basicConfig(level=settings.LOGGING["root"]["level"])
        if not (settings.PLUGIN_TLS_CERT_FILE and settings.PLUGIN_TLS_KEY_FILE) and not settings.PLUGIN_CERT_FROM_API:
            raise CommandError(
                "GPUSTACK_PLUGIN_TLS_CERT_FILE and GPUSTACK_PLUGIN_TLS_KEY_FILE are required"
                " (or GPUSTACK_PLUGIN_CERT_FROM_API=true: the API issues the certificate)"
            )
        csi_socket = settings.PLUGIN_CSI_SOCKET or str(settings.DATA_DIR / "plugin" / node / "csi.sock")
        try:
            check_socket_path(csi_socket, "GPUSTACK_PLUGIN_CSI_SOCKET")
            if settings.PLUGIN_REGISTRATION_DIR:
                check_socket_path(
                    registration_socket(settings.PLUGIN_REGISTRATION_DIR), "GPUSTACK_PLUGIN_REGISTRATION_DIR"
                )
        except SocketPathError as exc:
            raise CommandError(str(exc)) from None
        plugin = Plugin(plugin_settings(node, csi_socket))
        on_stop_signals(plugin.stopping.set)
        plugin.run()


def plugin_settings(node: str, csi_socket: str) -> PluginSettings:
    """The plugin's settings, from the process's."""
    return PluginSettings(
        node=node,
        cache_dir=settings.PLUGIN_CACHE_DIR or str(settings.DATA_DIR / "plugin" / node),
        address=settings.PLUGIN_ADDRESS or f"0.0.0.0:{settings.PLUGIN_PORT}",
        cert_file=settings.PLUGIN_TLS_CERT_FILE,
        key_file=settings.PLUGIN_TLS_KEY_FILE,
        api_url=settings.API_URL,
        api_ca_file=settings.API_CA_FILE,
        plugin_ca_file=settings.PLUGIN_CA_FILE,
        removal_delay_seconds=settings.PLUGIN_REMOVAL_DELAY_SECONDS,
        partial_retention_seconds=settings.PLUGIN_PARTIAL_RETENTION_SECONDS,
        progress_interval=settings.PLUGIN_PROGRESS_INTERVAL,
        capacity_bytes=settings.PLUGIN_CAPACITY_BYTES or None,
        auth_cache_ttl=settings.AUTH_CACHE_TTL,
        retry_base=settings.PLUGIN_RETRY_BASE,
        csi_socket=csi_socket,
        registration_dir=settings.PLUGIN_REGISTRATION_DIR,
        kubelet_dir=settings.PLUGIN_KUBELET_DIR,
        peer_port=settings.PLUGIN_PEER_PORT,
        peer_ca_file=settings.PLUGIN_PEER_CA_FILE,
        peer_max_connections=settings.PLUGIN_PEER_MAX_CONNECTIONS,
        peer_max_bytes_per_second=settings.PLUGIN_PEER_MAX_BYTES_PER_SECOND,
        fanout=settings.PLUGIN_FANOUT,
        cert_from_api=settings.PLUGIN_CERT_FROM_API
        and not (settings.PLUGIN_TLS_CERT_FILE and settings.PLUGIN_TLS_KEY_FILE),
        cert_dir=str(settings.DATA_DIR / "plugin" / node / "serving-tls"),
    )
