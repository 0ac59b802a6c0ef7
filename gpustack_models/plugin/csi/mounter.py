"""The mounter (``python -m gpustack_models.plugin --role mounter``): the one privileged part of the plugin's Pod.

It serves the CSI driver on the kubelet's socket and registers it, asks the API for each mount with the
Pod's token, and bind-mounts published trees read-only into Pods' volumes (propagated to the node). It
parses no network input but the kubelet's gRPC calls on a unix socket and the API's answers; the
downloads, the cache, the HTTPS and peer servers run in the non-root ``node`` role, which it talks to
through files (``shared_files``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from gpustack_models import kube
from gpustack_models.plugin.csi.driver import Driver, IdentityService, NodeService
from gpustack_models.plugin.csi.mount_client import MountClient
from gpustack_models.plugin.csi.registration import CsiServers
from gpustack_models.plugin.csi.shared_files import SharedEngine
from gpustack_models.plugin.csi.uninstalling import drain, purge, uninstalling

log = logging.getLogger(__name__)

RELEASE_RETRY_SECONDS = 10.0  # between retries of the releases the API did not take


@dataclass
class MounterSettings:
    node: str
    cache_dir: str  # the cache the node role writes (read here)
    mounts_dir: str  # the mount records, and the mounted digests the node role reads (written here)
    api_url: str
    api_ca_file: str
    csi_socket: str
    registration_dir: str = ""  # the kubelet's plugins_registry ("": do not register)
    kubelet_dir: str = ""  # target paths must be under its pods/ ("": not checked)
    annotations_file: str = ""  # its Pod's annotations (downwardAPI): marked as uninstalling, it drains first
    purge_on_uninstall: bool = False  # after a drain, delete the node's cache, mount records and plugin state
    state_dir: str = ""  # the node role's state (its certificates), purged with the cache


class Mounter:
    def __init__(self, settings: MounterSettings, client: kube.Kube | None = None):
        self.settings = settings
        self.kube = client or kube.default()
        self.stopping = threading.Event()
        api = MountClient(settings.api_url, settings.api_ca_file, settings.node, self.kube.auth_headers)
        engine = SharedEngine(settings.cache_dir, settings.mounts_dir)
        self.driver = Driver(engine, settings.node, api, settings.kubelet_dir, mounts_dir=settings.mounts_dir)

    def run(self) -> None:
        settings = self.settings
        node = NodeService(self.driver)
        servers = CsiServers(settings.csi_socket, settings.registration_dir, IdentityService(), node)
        servers.start()
        log.info("mounter for node %s: CSI driver on %s, cache %s", settings.node, settings.csi_socket,
                 settings.cache_dir)  # fmt: skip
        while not self.stopping.wait(RELEASE_RETRY_SECONDS):
            try:
                self.driver.retry_releases()
            except Exception as exc:
                log.warning("retrying releases: %s", exc)
        if uninstalling(settings.annotations_file):
            self.drain()
        servers.stop()  # the mounts stay: Pods keep their models while the mounter restarts
        log.info("mounter for node %s stopped", settings.node)

    def drain(self) -> None:
        """The release is being uninstalled: unmount what the kubelet asks until nothing is published."""
        drain(self.driver.table.digests)
        if self.settings.purge_on_uninstall:
            purge(self.settings.cache_dir, self.settings.mounts_dir, self.settings.state_dir)
