"""The node plugin process (``python -m gpustack_models.plugin --node NAME``, the DaemonSet's entry point).

It watches its own NodeModelStore (``kube.watch``, the one watch loop), holds the digests ``spec.models``
references with the download engine (``engine``: items with a ``collectTime`` are not downloaded, what
left ``spec.models`` is removed after a short delay, disk pressure evicts what nothing references),
asks the API for a fetch ticket per referenced digest with its Pod-bound token, writes the store's
status from what is on disk (``store_status``), and serves ``GET /model/downloads`` (live bytes, for
the service's client certificate only), ``/readyz``, ``/livez`` and ``/metrics`` over HTTPS (``endpoints``).
It serves the CSI driver ``model.csi.gpustack.ai`` on a unix socket and registers it with the kubelet
(``csi``), and what its node holds to other nodes' plugins on its peer port (``peer_server``; the contract
is ``peers``), to their client certificates.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import requests

from gpustack_models import kube
from gpustack_models.kinds import GROUP, STORAGE_VERSION
from gpustack_models.kube.watch import WatchHandler, WatchTarget, watch_forever
from gpustack_models.plugin.csi.driver import Driver, IdentityService, NodeService
from gpustack_models.plugin.csi.mount_client import MountClient
from gpustack_models.plugin.csi.registration import CsiServers
from gpustack_models.plugin.csi.shared_files import MountedFollower
from gpustack_models.plugin.engine import FAILED, READY, DownloadSettings, Engine, FanOutFactory, FetchTicket
from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.metrics import Metrics
from gpustack_models.plugin.node.endpoints import serve
from gpustack_models.plugin.node.serving_cert import ServingCertificate, client_files
from gpustack_models.plugin.node.status_writer import StatusWriter
from gpustack_models.plugin.peers.contract import ClientCertificate
from gpustack_models.plugin.peers.fanout import FanOut
from gpustack_models.plugin.peers.peer_client import PeerAccess
from gpustack_models.plugin.peers.peer_server import (
    PeerAdmission,
    PeerService,
    UploadLimits,
    serve_peers,
    set_upload_limits,
    upload_limits,
)
from gpustack_models.plugin.peers.swarm import SwarmSettings

log = logging.getLogger(__name__)


@dataclass
class PluginSettings:
    node: str
    cache_dir: str
    address: str  # host:port to serve HTTPS on
    cert_file: str
    key_file: str
    api_url: str  # the API's HTTPS base URL (tickets, mounts, certificates)
    api_ca_file: str
    plugin_ca_file: str = ""  # the CA of the client certificates the main port takes (the service's)
    removal_delay_seconds: float = 60.0  # a published tree out of spec.models stays this long
    partial_retention_seconds: float = 86400.0  # partial work and failures out of spec.models: this long
    progress_interval: float = 30.0
    capacity_bytes: int | None = None
    auth_cache_ttl: float = 10.0
    retry_base: float = 60.0
    csi_socket: str = ""  # the CSI driver's unix socket ("": no CSI driver)
    registration_dir: str = ""  # the kubelet's plugins_registry directory ("": do not register)
    kubelet_dir: str = ""  # the kubelet's root: target paths must be under its pods/ ("": not checked)
    peer_port: int = 0  # the peer endpoints' port on the address's host (0: no peer server)
    peer_ca_file: str = ""  # the CA its peers' certificates (serving and client) are checked against
    peer_max_connections: int = 8  # peer transfers in flight on the node, until the store's spec.upload says
    peer_max_bytes_per_second: int = 0  # their upload rate (0: no limit), likewise
    fanout: bool = True  # downloads take what the tickets' peers hold
    cert_from_api: bool = False  # no certificate files: the API issues one for the Pod IP (serving_cert)
    cert_dir: str = ""  # ... kept here, with its key, and the client certificate the peers take
    # The plugin's Pod split (``--role``): "all" serves the CSI driver in this process; "node"
    # leaves it to the privileged mounter and follows what it mounts through ``mounts_dir``
    # (``csi.shared_files``).
    role: str = "all"
    mounts_dir: str = ""  # the CSI driver's records ("": <cache>/mounts)


STOP_SECONDS = 5.0  # on SIGTERM, how long running downloads get to checkpoint and stop
MOUNT_TOUCH_SECONDS = 60.0  # a mounted tree's lastUsedTime is moved this often
RELEASE_RETRY_EVERY = 5  # reconcile passes (2 s each) between retries of releases the API did not take


def peer_fan_out(node: str, access: PeerAccess | None, swarm: SwarmSettings | None = None) -> FanOutFactory | None:
    """How the engine's downloads take what the tickets' peers hold (``peers.fanout``): this node's name,
    how it reaches other nodes' plugins, and the swarm's tuning; ``None`` (hubs only) without either."""
    if not node or access is None:
        return None

    def fan_out(ticket: FetchTicket, download, on_peer_bytes) -> FanOut:
        return FanOut(ticket, node, access, download, swarm, on_peer_bytes)

    return fan_out


class StoreWatch(WatchHandler):
    """The plugin's own NodeModelStore, as the watch sees it."""

    def __init__(self, plugin: Plugin):
        self.plugin = plugin

    def page(self, items: list[dict]) -> None:
        for item in items:
            self.plugin.on_store(item)

    def event(self, type_: str, obj: dict) -> None:
        if type_ == "DELETED":
            self.plugin.uid = ""  # the recreated store gets the status back
        else:
            self.plugin.on_store(obj)


class Plugin:
    def __init__(self, settings: PluginSettings, client: kube.Kube | None = None):
        self.settings = settings
        self.kube = client or kube.default()
        self.stopping = threading.Event()
        self.metrics = Metrics()
        # client_tls() -> SSLContext: this plugin's client certificate for its peers (peers.ClientCertificate),
        # issued by the API with the serving one; none with certificate files (no fan-out then).
        self.client_tls = (
            ClientCertificate(*client_files(settings.cert_dir), settings.peer_ca_file or None)
            if settings.cert_from_api
            else None
        )
        self.engine = Engine(
            settings.cache_dir,
            capacity_bytes=settings.capacity_bytes,
            on_change=self._changed,
            metrics=self.metrics,
            settings=DownloadSettings(),
            retry_base=settings.retry_base,
            removal_delay=settings.removal_delay_seconds,
            partial_retention=settings.partial_retention_seconds,
            fan_out=peer_fan_out(settings.node, self._peer_access()),
        )
        self.writer = StatusWriter(self)
        self.generation = 0
        self.uid = ""
        self.wanted: list[str] = []
        self.spec_seen = threading.Event()
        self._fetching: set[str] = set()
        self._lock = threading.Lock()
        self.uploads = UploadLimits(settings.peer_max_connections, settings.peer_max_bytes_per_second)
        self.metrics.attach_uploads(self.uploads)
        self.peers = None  # the peer server, while it runs
        self.certificate: ServingCertificate | None = None  # the API-issued serving certificate, if any
        self.csi: Driver | None = None
        self.mounter: MountedFollower | None = None  # role "node": what the mounter has mounted
        self._mounting(settings)

    def _mounting(self, settings: PluginSettings) -> None:
        """Role "node": follow what the mounter has mounted; otherwise serve the CSI driver here (when a
        socket is set)."""
        if settings.role == "node":
            self.mounter = MountedFollower(self.engine, settings.mounts_dir or f"{settings.cache_dir}/mounts")
            self.mounter.sync()  # held before the first collection
        elif settings.csi_socket:
            api = MountClient(settings.api_url, settings.api_ca_file, settings.node, self.kube.auth_headers)
            self.csi = Driver(self.engine, settings.node, api, settings.kubelet_dir, self.writer.kick.set,
                              settings.mounts_dir or None)  # fmt: skip

    def _peer_access(self) -> PeerAccess | None:
        """How downloads reach the tickets' peers (``fanout``): our client certificate and the peers' CA, and
        the ticket asked for again to learn of new peers; ``None`` when fan-out is off or we have no client
        certificate."""
        if not self.settings.fanout or self.client_tls is None:
            return None
        return PeerAccess(tls=self.client_tls, refresh=self.fetch_ticket)

    # --- events ----------------------------------------------------------------------------------------
    def _changed(self, digest, entry) -> None:
        self.writer.kick.set()

    def on_store(self, obj: dict) -> None:
        """A version of our NodeModelStore: follow its spec; a new UID gets its status back from disk."""
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        if meta.get("uid") != self.uid:
            if self.uid:
                log.info(
                    "store %s was recreated (uid %s); writing its status from disk", meta.get("name"), meta.get("uid")
                )
            self.uid = meta.get("uid", "")
            self.writer.force = True
        self.generation = meta.get("generation") or 0
        download = spec.get("download") or {}
        self.engine.set_limits(download.get("concurrency") or 8, download.get("bytesPerSecond") or 0)
        self._follow_uploads(spec)
        marks = spec.get("watermarks") or {}
        try:
            self.engine.set_watermarks(marks.get("highPercent", 80), max(1, marks.get("lowPercent", 70)))
        except ValueError as exc:
            log.warning("ignoring watermarks: %s", exc)
        models = [m for m in spec.get("models") or [] if isinstance(m, dict) and m.get("digest")]
        self.engine.set_wanted(models)
        # Only referenced digests are downloaded; one with a collectTime is kept if there, never fetched.
        self.wanted = [m["digest"] for m in models if m.get("collectTime") is None]
        self.spec_seen.set()
        self.writer.kick.set()
        self.reconcile()

    def _follow_uploads(self, spec: dict) -> None:
        """The peer endpoints' limits of ``spec.upload`` (the plugin's settings for what it leaves out)."""
        fallback = (self.settings.peer_max_connections, self.settings.peer_max_bytes_per_second)
        connections, rate = upload_limits(spec, fallback)
        if set_upload_limits(self.uploads, self.peers, connections, rate):
            log.info("peer uploads: at most %d transfers at once, %d bytes per second (0: no limit)", connections, rate)

    def reconcile(self) -> None:
        """Start what the spec references and is not held; collect what it stopped asking for, and
        evict under disk pressure."""
        running = {d["digest"] for d in self.engine.running()}
        for digest in list(self.wanted):
            entry = self.engine.entry(digest)
            # A download interrupted by a restart is Downloading but not running: resume it.
            if entry is not None and (entry.state == READY or digest in running):
                continue
            if entry is not None and entry.state == FAILED and entry.retry_time and entry.retry_time > time.time():
                continue
            with self._lock:
                if digest in self._fetching:
                    continue
                self._fetching.add(digest)
            threading.Thread(target=self._start, args=(digest,), daemon=True, name=f"ticket-{digest[7:19]}").start()
        removed = self.engine.collect() if self.spec_seen.is_set() else []
        if removed:
            self.writer.kick.set()

    def _start(self, digest: str) -> None:
        try:
            ticket = self.fetch_ticket(digest)
            if ticket is not None:
                self.engine.ensure(ticket)
        except DownloadFailed as exc:
            log.warning("%s: %s", digest, exc)
        except Exception as exc:  # the API unreachable: the next reconcile asks again
            log.warning("no fetch ticket for %s yet: %s", digest, exc)
        finally:
            with self._lock:
                self._fetching.discard(digest)

    def fetch_ticket(self, digest: str) -> FetchTicket | None:
        """Ask the API for ``digest``'s ticket with our Pod-bound token: every source of the digest,
        in the order to try them. The hub tokens in it stay in memory."""
        session = requests.Session()
        session.trust_env = False
        resp = session.post(
            f"{self.settings.api_url.rstrip('/')}/internal/v1/tickets",
            json={"node": self.settings.node, "digest": digest},
            headers=self.kube.auth_headers(),
            verify=self.settings.api_ca_file,
            timeout=30,
        )
        try:
            answer = kube.KubeResponse(resp.status_code, dict(resp.headers), resp.content).raise_for_status()
        except (kube.NotFound, kube.Conflict) as exc:  # no store, or no resolution of the digest yet
            log.info("%s: the API has no ticket yet (%s)", digest, exc.message)
            return None
        return FetchTicket.from_dict(answer.json())

    # --- watching our store ----------------------------------------------------------------------------
    def watch_store(self) -> None:
        target = WatchTarget(
            f"/apis/{GROUP}/{STORAGE_VERSION}/nodemodelstores", field_selector=f"metadata.name={self.settings.node}"
        )
        watch_forever(self.kube, target, StoreWatch(self), self.stopping, name="store")

    def reconcile_forever(self) -> None:
        passes = 0
        while not self.stopping.wait(2.0):
            passes += 1
            try:
                self.reconcile()
                if self.mounter is not None and self.mounter.sync():
                    self.writer.kick.set()
                self.engine.touch_mounted(MOUNT_TOUCH_SECONDS)
                if self.csi is not None and passes % RELEASE_RETRY_EVERY == 0:
                    self.csi.retry_releases()
            except Exception as exc:
                log.warning("reconcile: %s", exc)

    # --- the process -----------------------------------------------------------------------------------
    def csi_servers(self) -> CsiServers | None:
        if self.csi is None:
            return None
        settings = self.settings
        return CsiServers(settings.csi_socket, settings.registration_dir, IdentityService(), NodeService(self.csi))

    def peer_server(self):
        """The peer endpoints' server (not started), or ``None`` without a peer port."""
        settings = self.settings
        if not settings.peer_port:
            return None
        admission = PeerAdmission(lambda: self.kube, settings.auth_cache_ttl)
        service = PeerService(self.engine, admission, self.uploads, self.metrics)
        self.peers = serve_peers(self, service, settings.peer_port)
        return self.peers

    def issued_certificate(self) -> bool:
        """With ``cert_from_api``: the API's certificate in place before anything serves (False when
        stopped first), renewed by a thread that loads each new one into the servers."""
        settings = self.settings
        if not settings.cert_from_api:
            return True
        issued = ServingCertificate(
            settings.cert_dir, settings.node, settings.api_url, settings.api_ca_file, self.kube.auth_headers
        )
        if not issued.obtain(self.stopping):
            return False
        settings.cert_file, settings.key_file = issued.cert_file, issued.key_file
        self.certificate = issued
        return True

    def follow_certificate(self, servers) -> None:
        issued = self.certificate
        if issued is None:
            return
        for server in servers:
            issued.listeners.append(server.load_certificate)
        threading.Thread(target=issued.renew_forever, args=(self.stopping,), name="cert-renewal", daemon=True).start()

    def run(self) -> None:
        if not self.issued_certificate():
            log.info("plugin for node %s stopped before it had a serving certificate", self.settings.node)
            return
        server, peers = serve(self), self.peer_server()
        self.follow_certificate([s for s in (server, peers) if s is not None])
        csi = self.csi_servers()
        if csi is not None:
            csi.start()
        threads = [
            threading.Thread(target=server.serve_forever, name="https", daemon=True),
            *([threading.Thread(target=peers.serve_forever, name="peers", daemon=True)] if peers else []),
            threading.Thread(target=self.watch_store, name="store-watch", daemon=True),
            threading.Thread(target=self.writer.run, name="status-writer", daemon=True),
            threading.Thread(target=self.reconcile_forever, name="reconcile", daemon=True),
        ]
        for thread in threads:
            thread.start()
        log.info(
            "plugin for node %s serving on %s, cache %s",
            self.settings.node,
            self.settings.address,
            self.settings.cache_dir,
        )
        self.stopping.wait()
        self.stop(server, csi)

    def stop(self, server, csi: CsiServers | None) -> None:
        """SIGTERM: running downloads are cancelled and checkpointed (they stay Downloading on disk and the
        next start resumes them) while the servers stop, all within ``STOP_SECONDS``."""
        closing = threading.Thread(target=self.engine.close, kwargs={"timeout": STOP_SECONDS}, name="engine-close")
        closing.start()
        log.info("stopping: downloads checkpointing; closing the HTTPS server")  # each step logged: one that
        server.shutdown()  # hangs is the last line (and the stop deadline then logs every thread's stack)
        if self.peers is not None:
            log.info("stopping: closing the peer server")
            self.peers.shutdown()
        if csi is not None:
            log.info("stopping: closing the CSI servers")
            csi.stop()  # the mounts stay: Pods keep their models while the plugin restarts
        log.info("stopping: waiting for the downloads' checkpoints")
        closing.join()
        log.info("plugin for node %s stopped", self.settings.node)
