"""The node plugin process (``manage.py runplugin --node NAME``, the DaemonSet's entry point).

It watches its own NodeModelStore, holds the digests ``spec.models`` lists with the download engine
(``gpustack_models.plugin``), asks the worker for a fetch ticket per digest with its Pod-bound token, writes
the store's status from what is on disk, and serves ``GET /model/downloads`` (live bytes, for the worker
only), ``/readyz``, ``/livez`` and ``/metrics`` over HTTPS.

Status writes follow DESIGN §3: every change of state is written at once; progress fields
(``downloadedBytes``, ``storedBytes``, ``usedPercent``) only when at least ``progress_interval`` seconds
have passed since the last write *and* some download moved at least 5 % of its size; a quiet node writes
nothing. The status is rebuilt from disk at start and whenever the store's UID changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import ssl
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
import urllib3

from . import kube
from .cache import TTLCache
from .plugin import DownloadSettings, Engine, FetchTicket
from .plugin.failures import DownloadFailed
from .plugin.metrics import Metrics
from .resources.kinds import GROUP, STORAGE_VERSION

log = logging.getLogger(__name__)

API = f"{GROUP}/{STORAGE_VERSION}"
FIELD_MANAGER = "gpustack-models-plugin"
PROGRESS_FIELDS = ("downloadedBytes",)
MAX_ENTRIES = 256


@dataclass
class PluginSettings:
    node: str
    cache_dir: str
    address: str  # host:port to serve HTTPS on
    cert_file: str
    key_file: str
    worker_url: str  # the worker's HTTPS base URL (ticket endpoint)
    worker_ca_file: str
    worker_username: str  # whose token may read /model/downloads
    grace_seconds: float = 600.0
    progress_interval: float = 30.0
    capacity_bytes: int | None = None
    auth_cache_ttl: float = 10.0
    retry_base: float = 60.0


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusWriter:
    """Writes the store's status from the engine, on the thresholds of DESIGN §3."""

    def __init__(self, plugin: Plugin):
        self.plugin = plugin
        self.written: dict | None = None  # the status last written
        self.written_at = 0.0
        self.kick = threading.Event()
        self.force = False
        self.writes = 0

    def snapshot(self) -> dict:
        engine = self.plugin.engine
        models = [e.status() for e in engine.entries()][:MAX_ENTRIES]
        capacity = engine.capacity()
        low = engine.capacity_low()
        previous = {c["type"]: c for c in ((self.written or {}).get("conditions") or [])}

        def cond(type_, status, reason, message):
            old = previous.get(type_)
            since = old["lastTransitionTime"] if old and old.get("status") == status else now_iso()
            return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}

        return {
            "observedGeneration": self.plugin.generation,
            "capacity": capacity,
            "models": models,
            "conditions": [
                cond("Ready", "True", "PluginRunning", "the node plugin is running"),
                cond(
                    "CapacityLow",
                    "True" if low else "False",
                    "AboveHighWatermark" if low else "BelowWatermarks",
                    f"{capacity['usedPercent']}% of the cache volume is used",
                ),
            ],
        }

    @staticmethod
    def _without_progress(status: dict) -> dict:
        out = json.loads(json.dumps(status))
        out["capacity"] = {k: v for k, v in out["capacity"].items() if k == "totalBytes"}
        for model in out["models"]:
            for key in PROGRESS_FIELDS:
                if model.get("state") == "Downloading":
                    model.pop(key, None)
        for c in out["conditions"]:
            c.pop("message", None)
            c.pop("lastTransitionTime", None)
        return out

    def _moved_enough(self, new: dict) -> bool:
        old = {m["digest"]: m for m in (self.written or {}).get("models") or []}
        for model in new["models"]:
            if model.get("state") != "Downloading":
                continue
            before = old.get(model["digest"], {}).get("downloadedBytes", 0)
            size = model.get("sizeBytes") or 0
            if size and (model.get("downloadedBytes", 0) - before) * 20 >= size:
                return True
        return False

    def due(self, new: dict) -> bool:
        if self.force or self.written is None:
            return True
        if self._without_progress(new) != self._without_progress(self.written):
            return True
        if new == self.written:
            return False
        return time.monotonic() - self.written_at >= self.plugin.settings.progress_interval and self._moved_enough(new)

    def tick(self) -> bool:
        new = self.snapshot()
        if not self.due(new):
            return False
        body = {
            "apiVersion": API,
            "kind": "NodeModelStore",
            "metadata": {"name": self.plugin.settings.node},
            "status": new,
        }
        try:
            self.plugin.kube.apply(
                f"/apis/{API}/nodemodelstores/{self.plugin.settings.node}/status", body, field_manager=FIELD_MANAGER
            )
        except kube.KubeError as exc:
            if exc.status == 404:  # no store (yet): the worker creates it; write when it appears
                return False
            raise
        self.written, self.written_at, self.force = new, time.monotonic(), False
        self.writes += 1
        return True

    def run(self) -> None:
        while not self.plugin.stopping.is_set():
            self.kick.wait(1.0)
            self.kick.clear()
            try:
                self.tick()
            except Exception as exc:
                log.warning("writing the store's status failed: %s", exc)
                time.sleep(1)


class Plugin:
    def __init__(self, settings: PluginSettings, client: kube.Kube | None = None):
        self.settings = settings
        self.kube = client or kube.worker()
        self.stopping = threading.Event()
        self.metrics = Metrics()
        self.engine = Engine(
            settings.cache_dir,
            capacity_bytes=settings.capacity_bytes,
            on_change=self._changed,
            metrics=self.metrics,
            settings=DownloadSettings(),
            retry_base=settings.retry_base,
        )
        self.writer = StatusWriter(self)
        self.generation = 0
        self.uid = ""
        self.wanted: list[str] = []
        self.spec_seen = threading.Event()
        self._reviews = TTLCache(maxsize=256)
        self._fetching: set[str] = set()
        self._lock = threading.Lock()

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
        marks = spec.get("watermarks") or {}
        try:
            self.engine.set_watermarks(marks.get("highPercent", 80), max(1, marks.get("lowPercent", 70)))
        except ValueError as exc:
            log.warning("ignoring watermarks: %s", exc)
        self.wanted = [m["digest"] for m in spec.get("models") or [] if m.get("digest")]
        self.spec_seen.set()
        self.writer.kick.set()
        self.reconcile()

    def reconcile(self) -> None:
        """Start what the spec asks for and is not held; collect what it stopped asking for."""
        running = {d["digest"] for d in self.engine.running()}
        for digest in list(self.wanted):
            entry = self.engine.entry(digest)
            # A download interrupted by a restart is Downloading but not running: resume it.
            if entry is not None and (entry.state == "Ready" or digest in running):
                continue
            if entry is not None and entry.state == "Failed" and entry.retry_time and entry.retry_time > time.time():
                continue
            with self._lock:
                if digest in self._fetching:
                    continue
                self._fetching.add(digest)
            threading.Thread(target=self._start, args=(digest,), daemon=True, name=f"ticket-{digest[7:19]}").start()
        removed = self.engine.collect(self.wanted, self.settings.grace_seconds) if self.spec_seen.is_set() else []
        for digest in removed:
            log.info("removed %s after %.0fs out of spec.models", digest, self.settings.grace_seconds)
        if removed:
            self.writer.kick.set()

    def _start(self, digest: str) -> None:
        try:
            ticket = self.fetch_ticket(digest)
            if ticket is not None:
                self.engine.ensure(ticket)
        except DownloadFailed as exc:
            log.warning("%s: %s", digest, exc)
        except Exception as exc:  # the worker unreachable: the next reconcile asks again
            log.warning("no fetch ticket for %s yet: %s", digest, exc)
        finally:
            with self._lock:
                self._fetching.discard(digest)

    def fetch_ticket(self, digest: str) -> FetchTicket | None:
        """Ask the worker for ``digest``'s ticket with our Pod-bound token. The hub token in it stays
        in memory."""
        session = requests.Session()
        session.trust_env = False
        resp = session.post(
            f"{self.settings.worker_url.rstrip('/')}/internal/v1/tickets",
            json={"node": self.settings.node, "digest": digest},
            headers=self.kube.auth_headers(),
            verify=self.settings.worker_ca_file,
            timeout=30,
        )
        if resp.status_code in (404, 409):
            log.info("%s: the worker has no ticket yet (%s)", digest, resp.json().get("message", ""))
            return None
        if resp.status_code != 200:
            raise RuntimeError(f"ticket answer {resp.status_code}: {resp.text[:200]}")
        data = resp.json()
        return FetchTicket.from_dict(data, token=data.get("token"))

    # --- watching our store ----------------------------------------------------------------------------
    def watch_store(self) -> None:
        path = f"/apis/{API}/nodemodelstores"
        selector = f"metadata.name={self.settings.node}"
        rv = ""
        backoff = 0.5
        while not self.stopping.is_set():
            try:
                if not rv:
                    listed = self.kube.get(path, query={"fieldSelector": selector})
                    for item in listed.get("items") or []:
                        self.on_store(item)
                    rv = listed["metadata"]["resourceVersion"]
                resp = self.kube.pool.request(
                    "GET",
                    self.kube.url(
                        path,
                        {
                            "watch": "true",
                            "fieldSelector": selector,
                            "resourceVersion": rv,
                            "allowWatchBookmarks": "true",
                            "timeoutSeconds": "300",
                        },
                    ),
                    headers={"Accept": "application/json", **self.kube.auth_headers()},
                    timeout=urllib3.Timeout(connect=10, read=90),
                    preload_content=False,
                )
                try:
                    if resp.status == 410:
                        rv = ""
                        continue
                    if resp.status != 200:
                        raise kube.KubeError(resp.status, resp.read())
                    for line in resp:
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            rv = "" if obj.get("code") == 410 else rv
                            break
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self.on_store(obj)
                        elif event.get("type") == "DELETED":
                            self.uid = ""  # the recreated store gets the status back
                finally:
                    resp.release_conn()
                backoff = 0.5
            except Exception as exc:
                log.warning("watching the store: %s; again in %.1fs", exc, backoff)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 30)
                rv = ""

    def reconcile_forever(self) -> None:
        while not self.stopping.wait(2.0):
            try:
                self.reconcile()
            except Exception as exc:
                log.warning("reconcile: %s", exc)

    # --- the HTTPS endpoint ----------------------------------------------------------------------------
    def authorized_worker(self, header: str | None) -> int:
        """200 for the worker's token, 401 without a valid token, 403 for anyone else."""
        if not header or not header.lower().startswith("bearer "):
            return 401
        token = header[7:].strip()
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._reviews.get(key)
        if hit is None:
            review = self.kube.create(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
            )
            status = review.get("status") or {}
            user = (status.get("user") or {}).get("username") if status.get("authenticated") else None
            hit = 200 if user == self.settings.worker_username else (403 if user else 401)
            self._reviews.set(key, hit, self.settings.auth_cache_ttl)
        return hit

    def serve(self) -> ThreadingHTTPServer:
        plugin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):  # requests are not logged (tokens travel in headers)
                pass

            def _send(self, code: int, body: bytes, content_type="application/json"):
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = self.path.split("?")[0]
                if path in ("/readyz", "/livez"):
                    return self._send(200, b"ok", "text/plain")
                if path == "/metrics":
                    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

                    return self._send(200, generate_latest(plugin.metrics.registry), CONTENT_TYPE_LATEST)
                if path == "/model/downloads":
                    code = plugin.authorized_worker(self.headers.get("Authorization"))
                    if code != 200:
                        reason = "Unauthorized" if code == 401 else "Forbidden"
                        body = {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "code": code,
                            "reason": reason,
                            "message": "only the gpustack-models worker reads live downloads",
                        }
                        return self._send(code, json.dumps(body).encode())
                    return self._send(200, json.dumps({"downloads": plugin.engine.running()}).encode())
                return self._send(404, b'{"kind":"Status","code":404,"reason":"NotFound"}')

        host, _, port = self.settings.address.rpartition(":")
        server = ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
        server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.settings.cert_file, self.settings.key_file)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        return server

    # --- the process -----------------------------------------------------------------------------------
    def run(self) -> None:
        server = self.serve()
        threads = [
            threading.Thread(target=server.serve_forever, name="https", daemon=True),
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
        server.shutdown()
        self.engine.close(timeout=10)
