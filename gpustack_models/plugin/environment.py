"""The node plugin's settings, read from environment variables without Django (the plugin never loads
the service's settings module: see ``__main__``). Variables the service reads as well (the data
directory, the plugin CA, the ports, the review cache) come from ``gpustack_models.env_vars``, so each
has one definition; those below are the plugin's alone. A malformed value fails the start, naming the
variable (``ImproperlyConfigured``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpustack_models import env_vars as shared
from gpustack_models.env_vars import env_abs_path, env_bool, env_float, env_int, env_renamed, env_str, env_url
from gpustack_models.kube.credentials import Credentials, from_kubeconfig, in_cluster
from gpustack_models.plugin.csi.mounter import MounterSettings
from gpustack_models.plugin.node.agent import PluginSettings


@dataclass(frozen=True)
class PluginEnvironment:
    data_dir: Path
    # Where the plugin finds the API (its Service: tickets, mounts, certificates) and the CA of its certificate.
    # GPUSTACK_WORKER_URL and GPUSTACK_WORKER_CA_FILE are their deprecated names.
    api_url: str
    api_ca_file: str
    cache_dir: str  # GPUSTACK_PLUGIN_CACHE_DIR; default: $GPUSTACK_DATA_DIR/plugin/<node>
    address: str  # GPUSTACK_PLUGIN_ADDRESS; default: 0.0.0.0:$GPUSTACK_PLUGIN_PORT
    tls_cert_file: str
    tls_key_file: str
    # With no certificate files: ask the API for a serving certificate for the Pod IP (a key made on the node,
    # the certificate renewed at 2/3 of its validity), kept in the plugin's directory. False: the files are
    # required. GPUSTACK_PLUGIN_CERT_FROM_WORKER is its deprecated name.
    cert_from_api: bool
    # A published tree whose digest left spec.models is removed after this many seconds (a short safety
    # delay: the collection grace is the service's, before the digest leaves spec.models).
    removal_delay_seconds: float
    # Partial downloads (and failure records) of digests out of spec.models are removed after this long.
    partial_retention_seconds: float
    progress_interval: float  # progress fields are written at most this often (and only after a 5 % move)
    retry_base: float  # the first wait after a failed download (seconds); it doubles per failure up to an hour
    capacity_bytes: int  # treat the cache volume as this many bytes (0: the volume's real size)
    csi_socket: str  # default: $GPUSTACK_DATA_DIR/plugin/<node>/csi.sock; at most 107 bytes
    registration_dir: str  # the kubelet's plugin registration directory; empty: do not register
    kubelet_dir: str  # the kubelet's root directory: CSI target paths must then be under its pods/
    # Where the CSI driver keeps its mount records and tells the node role which digests are mounted
    # (default: $GPUSTACK_PLUGIN_CACHE_DIR/mounts). With --role mounter|node, a directory only the mounter
    # writes.
    mounts_dir: str
    # The mounter's own Pod annotations (a downwardAPI volume's file). When the uninstall hook has marked
    # the Pod (worker.gpustack.ai/uninstalling: "true"), a stopped mounter keeps serving NodeUnpublish until
    # its node has no publication left, then exits; and deletes the node's cache first when purge_on_uninstall.
    pod_annotations_file: str
    purge_on_uninstall: bool
    # Peers: the CA other plugins' certificates (serving and client) are checked against, and the node-wide
    # upload limits used until its store's spec.upload says otherwise.
    peer_ca_file: str
    peer_max_connections: int
    peer_max_bytes_per_second: int
    fanout: bool  # downloads take what the tickets' peers hold; false: every byte from the hubs
    plugin_ca_file: str
    port: int
    peer_port: int
    auth_cache_ttl: float

    @classmethod
    def read(cls) -> PluginEnvironment:
        data = shared.data_dir()
        plugin_ca = shared.plugin_ca_file(data)
        api_url = env_renamed("GPUSTACK_API_URL", "GPUSTACK_WORKER_URL")
        cert_from_api = env_renamed("GPUSTACK_PLUGIN_CERT_FROM_API", "GPUSTACK_PLUGIN_CERT_FROM_WORKER")
        return cls(
            data_dir=data,
            api_url=env_url(api_url, f"https://127.0.0.1:{shared.api_port()}", {"https"}),
            api_ca_file=env_str(
                env_renamed("GPUSTACK_API_CA_FILE", "GPUSTACK_WORKER_CA_FILE"), str(data / "api-pki" / "ca.crt")
            ),
            cache_dir=env_str("GPUSTACK_PLUGIN_CACHE_DIR", ""),
            address=env_str("GPUSTACK_PLUGIN_ADDRESS", ""),
            tls_cert_file=env_str("GPUSTACK_PLUGIN_TLS_CERT_FILE", ""),
            tls_key_file=env_str("GPUSTACK_PLUGIN_TLS_KEY_FILE", ""),
            cert_from_api=env_bool(cert_from_api, False),
            removal_delay_seconds=env_float("GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS", 60.0, minimum=0.0),
            partial_retention_seconds=env_float("GPUSTACK_PLUGIN_PARTIAL_RETENTION_SECONDS", 86400.0, minimum=0.0),
            progress_interval=env_float("GPUSTACK_PLUGIN_PROGRESS_INTERVAL", 30.0, minimum=0.1),
            retry_base=env_float("GPUSTACK_PLUGIN_RETRY_BASE", 60.0, minimum=1.0),
            capacity_bytes=env_int("GPUSTACK_PLUGIN_CAPACITY_BYTES", 0, minimum=0),
            csi_socket=env_abs_path("GPUSTACK_PLUGIN_CSI_SOCKET"),
            registration_dir=env_abs_path("GPUSTACK_PLUGIN_REGISTRATION_DIR"),
            kubelet_dir=env_abs_path("GPUSTACK_PLUGIN_KUBELET_DIR"),
            mounts_dir=env_abs_path("GPUSTACK_PLUGIN_MOUNTS_DIR"),
            pod_annotations_file=env_abs_path("GPUSTACK_PLUGIN_POD_ANNOTATIONS_FILE"),
            purge_on_uninstall=env_bool("GPUSTACK_PLUGIN_PURGE_ON_UNINSTALL", False),
            peer_ca_file=env_str("GPUSTACK_PLUGIN_PEER_CA_FILE", "") or plugin_ca,
            peer_max_connections=env_int("GPUSTACK_PLUGIN_PEER_MAX_CONNECTIONS", 8, minimum=1),
            peer_max_bytes_per_second=env_int("GPUSTACK_PLUGIN_PEER_MAX_BYTES_PER_SECOND", 0, minimum=0),
            fanout=env_bool("GPUSTACK_PLUGIN_FANOUT", True),
            plugin_ca_file=plugin_ca,
            port=shared.plugin_port(),
            peer_port=shared.plugin_peer_port(),
            auth_cache_ttl=shared.auth_cache_ttl(),
        )

    def node_dir(self, node: str) -> Path:
        return self.data_dir / "plugin" / node

    def cache_for(self, node: str) -> str:
        return self.cache_dir or str(self.node_dir(node))

    def csi_socket_for(self, node: str) -> str:
        return self.csi_socket or str(self.node_dir(node) / "csi.sock")

    def has_cert_files(self) -> bool:
        return bool(self.tls_cert_file and self.tls_key_file)

    def mounter(self, node: str) -> MounterSettings:
        """The mounter's settings (``--role mounter``)."""
        return MounterSettings(
            node=node,
            cache_dir=self.cache_for(node),
            mounts_dir=self.mounts_dir or f"{self.cache_for(node)}/mounts",
            api_url=self.api_url,
            api_ca_file=self.api_ca_file,
            csi_socket=self.csi_socket_for(node),
            registration_dir=self.registration_dir,
            kubelet_dir=self.kubelet_dir,
            annotations_file=self.pod_annotations_file,
            purge_on_uninstall=self.purge_on_uninstall,
            state_dir=str(self.data_dir / "plugin"),
        )

    def plugin(self, node: str, role: str = "all") -> PluginSettings:
        """The plugin's settings (``role`` all or node: the node role serves no CSI socket)."""
        return PluginSettings(
            node=node,
            role=role,
            mounts_dir=self.mounts_dir,
            cache_dir=self.cache_for(node),
            address=self.address or f"0.0.0.0:{self.port}",
            cert_file=self.tls_cert_file,
            key_file=self.tls_key_file,
            api_url=self.api_url,
            api_ca_file=self.api_ca_file,
            plugin_ca_file=self.plugin_ca_file,
            removal_delay_seconds=self.removal_delay_seconds,
            partial_retention_seconds=self.partial_retention_seconds,
            progress_interval=self.progress_interval,
            capacity_bytes=self.capacity_bytes or None,
            auth_cache_ttl=self.auth_cache_ttl,
            retry_base=self.retry_base,
            csi_socket="" if role == "node" else self.csi_socket_for(node),
            registration_dir=self.registration_dir,
            kubelet_dir=self.kubelet_dir,
            peer_port=self.peer_port,
            peer_ca_file=self.peer_ca_file,
            peer_max_connections=self.peer_max_connections,
            peer_max_bytes_per_second=self.peer_max_bytes_per_second,
            fanout=self.fanout,
            cert_from_api=self.cert_from_api and not self.has_cert_files(),
            cert_dir=str(self.node_dir(node) / "serving-tls"),
        )


def credentials(data_dir: Path) -> Credentials:
    """The plugin's identity, found as the service finds its own: KUBECONFIG, else the Pod's ServiceAccount,
    else the local control plane's kubeconfig under the data directory."""
    path = shared.kubeconfig()
    if path:
        return from_kubeconfig(path)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster()
    return from_kubeconfig(data_dir / "kubeconfig")
