import logging

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpustack_models.plugin.csi.mounter import Mounter, MounterSettings
from gpustack_models.plugin.csi.registration import SocketPathError, check_socket_path, registration_socket
from gpustack_models.plugin.node.agent import Plugin, PluginSettings
from gpustack_models.stop_signals import on_stop_signals

ROLES = ("all", "mounter", "node")


class Command(BaseCommand):
    help = "The node plugin: hold the digests this node's NodeModelStore lists, report them, serve live bytes."

    def add_arguments(self, parser):
        parser.add_argument("--node", required=True, help="the node this plugin runs on (its NodeModelStore's name)")
        parser.add_argument(
            "--role",
            choices=ROLES,
            default="all",
            help="mounter: the CSI driver and its mounts only (privileged); node: everything else (non-root);"
            " all: both in one process",
        )

    def handle(self, *args, node, role="all", **options):
        logging.basicConfig(level=settings.LOGGING["root"]["level"])
        csi_socket = settings.PLUGIN_CSI_SOCKET or str(settings.DATA_DIR / "plugin" / node / "csi.sock")
        if role != "node":
            check_csi_paths(csi_socket)
        if role == "mounter":
            mounter = Mounter(mounter_settings(node, csi_socket))
            on_stop_signals(mounter.stopping.set)
            mounter.run()
            return
        if not (settings.PLUGIN_TLS_CERT_FILE and settings.PLUGIN_TLS_KEY_FILE) and not settings.PLUGIN_CERT_FROM_API:
            raise CommandError(
                "GPUSTACK_PLUGIN_TLS_CERT_FILE and GPUSTACK_PLUGIN_TLS_KEY_FILE are required"
                " (or GPUSTACK_PLUGIN_CERT_FROM_API=true: the API issues the certificate)"
            )
        plugin = Plugin(plugin_settings(node, "" if role == "node" else csi_socket, role))
        on_stop_signals(plugin.stopping.set)
        plugin.run()


def check_csi_paths(csi_socket: str) -> None:
    try:
        check_socket_path(csi_socket, "GPUSTACK_PLUGIN_CSI_SOCKET")
        if settings.PLUGIN_REGISTRATION_DIR:
            check_socket_path(registration_socket(settings.PLUGIN_REGISTRATION_DIR), "GPUSTACK_PLUGIN_REGISTRATION_DIR")
    except SocketPathError as exc:
        raise CommandError(str(exc)) from None


def cache_dir(node: str) -> str:
    return settings.PLUGIN_CACHE_DIR or str(settings.DATA_DIR / "plugin" / node)


def mounter_settings(node: str, csi_socket: str) -> MounterSettings:
    """The mounter's settings (``--role mounter``), from the process's."""
    return MounterSettings(
        node=node,
        cache_dir=cache_dir(node),
        mounts_dir=settings.PLUGIN_MOUNTS_DIR or f"{cache_dir(node)}/mounts",
        api_url=settings.API_URL,
        api_ca_file=settings.API_CA_FILE,
        csi_socket=csi_socket,
        registration_dir=settings.PLUGIN_REGISTRATION_DIR,
        kubelet_dir=settings.PLUGIN_KUBELET_DIR,
        annotations_file=settings.PLUGIN_POD_ANNOTATIONS_FILE,
        purge_on_uninstall=settings.PLUGIN_PURGE_ON_UNINSTALL,
        state_dir=str(settings.DATA_DIR / "plugin"),
    )


def plugin_settings(node: str, csi_socket: str, role: str = "all") -> PluginSettings:
    """The plugin's settings, from the process's (``role`` all or node)."""
    return PluginSettings(
        node=node,
        role=role,
        mounts_dir=settings.PLUGIN_MOUNTS_DIR,
        cache_dir=cache_dir(node),
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
