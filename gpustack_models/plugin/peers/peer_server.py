"""The plugin's peer endpoints: what the node holds, served to other nodes' plugins (the contract is
``peers.contract``' docstring).

- ``PeerAdmission``: who may read a digest (a client certificate of the plugin CA for a node's plugin,
  required at the handshake, the node from its subject; and that node's NodeModelStore listing the
  digest, reused briefly);
- ``UploadLimits``: the node-wide transfers in flight and upload rate (``upload_limits``: what the store's
  ``spec.upload`` asks, ``set_upload_limits``: applied while the server runs);
- ``TreeViews``: a digest as peers see it (a published tree, or the download in progress);
- ``PeerRequestHandler`` / ``serve_peers``: the HTTPS server, on ``https_server``'s guarded server.

No header is taken as a credential (a bearer token is ignored); requests are not logged.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from gpustack_models.kinds import GROUP, STORAGE_VERSION
from gpustack_models.kinds.nodemodelstore import MAX_BYTES_PER_SECOND, MAX_UPLOAD_CONNECTIONS
from gpustack_models.kube import NotFound
from gpustack_models.kube.reviews import TTLCache
from gpustack_models.plugin.engine.limits import RateLimiter
from gpustack_models.plugin.https_server import (
    PLUGIN_SUBJECT_PREFIX,
    ConnectionLimits,
    GuardedHTTPSServer,
    GuardedRequestHandler,
    client_name,
    serving_tls,
    status,
)
from gpustack_models.plugin.peers.contract import PREFIX, covers

log = logging.getLogger(__name__)

READY, DOWNLOADING = "Ready", "Downloading"
_HEX = re.compile(r"[0-9a-f]{64}")
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_CHUNK = 1024 * 1024
REREAD_SECONDS = 1.0  # a digest not in a node's cached spec.models: its store is read again after this long
REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed"}
REASONS |= {416: "RequestedRangeNotSatisfiable", 503: "ServiceUnavailable"}


class Refused(Exception):
    """An answer other than the bytes: ``code`` and the ``Status`` message."""

    def __init__(self, code: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.code, self.message, self.headers = code, message, headers or {}


# ------------------------------------------------------------------------------------------ who


class PeerAdmission:
    """``authenticate(name)`` -> the caller's node; ``authorize(node, digest)``; each raises ``Refused``."""

    def __init__(self, client, ttl: float, maxsize: int = 1024):
        self._client = client  # a callable returning the plugin's Kube client
        self._stores = TTLCache(maxsize=maxsize)
        self._ttl = ttl

    @staticmethod
    def authenticate(name: str | None) -> str:
        """The node of a node plugin's client certificate (``https_server.client_name``: verified against
        the plugin CA at the handshake, ``clientAuth``), from its subject ``system:gpustack-models-plugin:<node>``."""
        if name is None:
            raise Refused(401, "a client certificate of a node plugin (of the plugin CA, for clientAuth) is required")
        node = name.removeprefix(PLUGIN_SUBJECT_PREFIX)
        if node == name or not node:
            raise Refused(403, "only the plugins of nodes read peers")
        return node

    def authorize(self, node: str, digest: str) -> None:
        wanted, read_at = self.wanted(node)
        if digest not in wanted and time.monotonic() - read_at >= REREAD_SECONDS:
            wanted, read_at = self.wanted(node, fresh=True)  # it may have just joined the spec
        if digest not in wanted:
            raise Refused(403, f"node {node} does not want this digest")

    def wanted(self, node: str, fresh: bool = False) -> tuple[frozenset[str], float]:
        """The digests of ``node``'s ``spec.models`` (read from its NodeModelStore, reused for the ttl)
        and when they were read."""
        hit = None if fresh else self._stores.get(node)
        if hit is not None:
            return hit
        try:
            store = self._client().get(f"/apis/{GROUP}/{STORAGE_VERSION}/nodemodelstores/{node}")
            models = (store.get("spec") or {}).get("models") or []
            wanted = frozenset(m["digest"] for m in models if isinstance(m, dict) and isinstance(m.get("digest"), str))
        except NotFound:
            wanted = frozenset()
        except Exception as exc:
            log.warning("peer request: cannot read the NodeModelStore of %s: %s", node, exc)
            raise Refused(503, "the caller's node cannot be checked now", {"Retry-After": "5"}) from None
        answer = (wanted, time.monotonic())
        self._stores.set(node, answer, self._ttl)
        return answer


# ------------------------------------------------------------------------------------------ how much


class UploadLimits:
    """At most ``limit`` transfers in flight (``try_acquire`` never waits) and ``rate`` bytes per second; both
    may change while transfers run (``set``): a lower limit refuses new transfers until enough have ended."""

    def __init__(self, limit: int, bytes_per_second: int = 0):
        self._lock = threading.Lock()
        self.limit = max(1, int(limit))
        self.in_use = 0
        self.rate = RateLimiter(bytes_per_second)

    def set(self, limit: int | None = None, bytes_per_second: int | None = None) -> None:
        if limit is not None:
            self.limit = max(1, int(limit))
        if bytes_per_second is not None:
            self.rate.set_rate(bytes_per_second)

    def try_acquire(self) -> bool:
        with self._lock:
            if self.in_use >= self.limit:
                return False
            self.in_use += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.in_use -= 1


def _setting(value, minimum: int, maximum: int, fallback: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        return fallback
    return value


def upload_limits(spec: dict, fallback: tuple[int, int]) -> tuple[int, int]:
    """The (connections, bytes per second) a store's ``spec`` asks of the peer endpoints (``spec.upload``);
    a field it leaves out, or one out of the schema's bounds, keeps ``fallback``'s (the plugin's settings)."""
    upload = spec.get("upload") if isinstance(spec, dict) else None
    upload = upload if isinstance(upload, dict) else {}
    return (
        _setting(upload.get("connections"), 1, MAX_UPLOAD_CONNECTIONS, fallback[0]),
        _setting(upload.get("bytesPerSecond"), 0, MAX_BYTES_PER_SECOND, fallback[1]),
    )


def connection_limits(transfers: int) -> ConnectionLimits:
    """The peer server's bounds for at most ``transfers`` transfers: more connections than transfers, so
    idle keep-alive connections of peers never keep a transfer out."""
    return ConnectionLimits(connections=max(128, 4 * transfers))


# ------------------------------------------------------------------------------------------ what


@dataclass(frozen=True)
class TreeView:
    digest: str
    state: str
    root: Path  # where the files are (the published tree, or the partial tree)
    files: dict[str, tuple[int, list[list[int]]]]  # path -> (size, have), in manifest order

    def body(self) -> dict:
        files = [{"path": p, "size": size, "have": have} for p, (size, have) in self.files.items()]
        return {"digest": self.digest, "state": self.state, "files": files}


class TreeViews:
    """A digest as peers see it: the published tree (its listing kept while the tree is the same), or the
    running download's files and the ranges written so far."""

    def __init__(self, engine):
        self.engine = engine
        self._listings: dict[str, tuple[tuple, dict]] = {}
        self._lock = threading.Lock()

    def view(self, digest: str) -> TreeView | None:
        cache = self.engine.cache
        tree = cache.tree(digest)
        listing = self._published(digest, tree)
        if listing is not None:
            return TreeView(digest, READY, tree, listing)
        written = self.engine.written(digest)
        if not written:
            return None
        files = {path: (size, have) for path, size, have in written}
        return TreeView(digest, DOWNLOADING, cache.partial_tree(digest), files)

    def _published(self, digest: str, tree: Path) -> dict | None:
        try:
            info = os.stat(tree)
        except OSError:
            return None
        key = (info.st_ino, info.st_mtime_ns)
        with self._lock:
            known = self._listings.get(digest)
        if known is not None and known[0] == key:
            return known[1]
        listing = {path: (size, [[0, size]] if size else []) for path, size in list_tree(tree)}
        with self._lock:
            if len(self._listings) >= 256:
                self._listings.clear()
            self._listings[digest] = (key, listing)
        return listing


def list_tree(root: Path) -> list[tuple[str, int]]:
    """The regular files under ``root`` (symbolic links not followed), as (relative path, size), in
    manifest order (by the path's UTF-8 bytes)."""
    out, stack = [], [""]
    while stack:
        prefix = stack.pop()
        with os.scandir(root / prefix if prefix else root) as entries:
            for entry in entries:
                relative = f"{prefix}/{entry.name}" if prefix else entry.name
                if entry.is_dir(follow_symlinks=False):
                    stack.append(relative)
                elif entry.is_file(follow_symlinks=False):
                    out.append((relative, entry.stat(follow_symlinks=False).st_size))
    return sorted(out, key=lambda item: item[0].encode("utf-8"))


def check_path(path: str) -> str:
    """``path`` if it is a relative path of plain segments, else ``Refused(400)``."""
    parts = path.split("/")
    if not path or "\x00" in path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise Refused(400, "the file path must be a relative path without '.', '..' or empty segments")
    return path


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The half-open range ``Range: bytes=...`` asks for within a file of ``size`` bytes (``None``
    without the header); ``Refused(400)`` when malformed or multi-part, ``Refused(416)`` when outside."""
    if header is None:
        return None
    m = _RANGE.fullmatch(header.strip())
    if m is None or (not m.group(1) and not m.group(2)):
        raise Refused(400, "Range must be one 'bytes=first-last', 'bytes=first-' or 'bytes=-suffix'")
    unsatisfiable = Refused(416, f"the file has {size} bytes", {"Content-Range": f"bytes */{size}"})
    if not m.group(1):
        suffix = int(m.group(2))
        if suffix == 0 or size == 0:
            raise unsatisfiable
        return max(0, size - suffix), size
    start = int(m.group(1))
    if m.group(2) and int(m.group(2)) < start:
        raise Refused(400, "the Range's last byte is before its first")
    end = min(size, int(m.group(2)) + 1) if m.group(2) else size
    if start >= size:
        raise unsatisfiable
    return start, end


# ------------------------------------------------------------------------------------------ the server


class PeerService:
    """What the handler needs: the admission, the views of the cache, the limits and the metrics."""

    def __init__(self, engine, admission: PeerAdmission, uploads: UploadLimits, metrics=None):
        self.engine, self.admission, self.uploads, self.metrics = engine, admission, uploads, metrics
        self.views = TreeViews(engine)

    def request(self, path: str, caller: str | None) -> tuple[str, TreeView, str | None]:
        """The caller's node (from ``caller``, its client certificate's name), the tree, and the file path
        asked for (``None``: the manifest); ``Refused`` otherwise. The caller is authenticated before the path
        is read, authorized before anything of the tree is looked at."""
        node = self.admission.authenticate(caller)
        rest = path[len(PREFIX) :] if path.startswith(PREFIX) else None
        hex_, _, tail = (rest or "").partition("/")
        if rest is None or not _HEX.fullmatch(hex_) or (tail and not tail.startswith("files/")):
            raise Refused(404, "not a peer endpoint: /peer/v1/trees/<hex>[/files/<path>]")
        digest = f"sha256:{hex_}"
        self.admission.authorize(node, digest)
        file = check_path(unquote(tail[len("files/") :], errors="strict")) if tail else None
        view = self.views.view(digest)
        if view is None:
            raise Refused(404, f"this node has no {digest}")
        if file is not None and file not in view.files:
            raise Refused(404, f"{digest} has no such file")
        return node, view, file

    def open(self, view: TreeView, path: str) -> int:
        """A descriptor of ``path`` in ``view`` (a download published meanwhile: in its published tree)."""
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(view.root / path, flags)
        except FileNotFoundError:
            if view.state != DOWNLOADING:
                raise
        return os.open(self.engine.cache.tree(view.digest) / path, flags)

    def answered(self, code: int) -> None:
        if self.metrics is not None:
            self.metrics.peer_answer(code)

    def served(self, node: str, n: int) -> None:
        if self.metrics is not None:
            self.metrics.bytes_served(node, n)


class PeerRequestHandler(GuardedRequestHandler):
    service: PeerService = None  # set on the subclass ``serve_peers`` makes

    def log_message(self, fmt, *args):
        pass

    def _status(self, code: int, message: str, headers: dict | None = None) -> None:
        body = status(code, REASONS.get(code, "Failure"), message)
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.service.answered(code)

    def do_GET(self):
        try:
            node, view, path = self.service.request(self.path.split("?")[0], client_name(self.connection))
            if path is None:
                return self._json(view.body())
            self._file(node, view, path)
        except Refused as refused:
            self._status(refused.code, refused.message, refused.headers)
        except UnicodeDecodeError:
            self._status(400, "the file path is not UTF-8")

    def _refuse_method(self):
        self.close_connection = True  # a body it may have sent is not read
        if self.command == "HEAD":  # an answer to HEAD has no body
            self.send_response(405)
            self.send_header("Allow", "GET")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return self.service.answered(405)
        self._status(405, "peer endpoints answer GET only", {"Allow": "GET"})

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _refuse_method

    def _json(self, document: dict) -> None:
        body = json.dumps(document, separators=(",", ":")).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.service.answered(200)

    def _file(self, node: str, view: TreeView, path: str) -> None:
        size, have = view.files[path]
        asked = parse_range(self.headers.get("Range"), size)
        start, end = asked if asked is not None else (0, size)
        if not covers(have, start, end):
            raise Refused(416, "this node does not have those bytes yet", {"Content-Range": f"bytes */{size}"})
        uploads = self.service.uploads
        if not uploads.try_acquire():
            raise Refused(503, f"{uploads.limit} peer transfers are in flight, the most allowed", {"Retry-After": "1"})
        try:
            self._send_bytes(node, view, path, (start, end, size), partial=asked is not None)
        finally:
            uploads.release()

    def _send_bytes(self, node: str, view: TreeView, path: str, span: tuple, *, partial: bool) -> None:
        start, end, size = span
        try:
            fd = self.service.open(view, path)
        except OSError:
            raise Refused(404, "the file is gone from this node") from None
        try:
            self.send_response(206 if partial else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start))
            if partial:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            self.end_headers()
            self.service.answered(206 if partial else 200)
            self._copy(fd, node, start, end)
        finally:
            os.close(fd)

    def _copy(self, fd: int, node: str, pos: int, end: int) -> None:
        """``[pos, end)`` of ``fd`` to the client under the upload rate; a file cut short closes the
        connection (the client sees a short body, never other bytes)."""
        rate = self.service.uploads.rate
        while pos < end:
            n = rate.chunk(min(_CHUNK, end - pos))
            rate.acquire(n)
            data = os.pread(fd, n, pos)
            if not data:
                self.close_connection = True
                return
            self.wfile.write(data)
            self.service.served(node, len(data))
            pos += len(data)


def serve_peers(plugin, service: PeerService, port: int) -> GuardedHTTPSServer:
    """The peer server of ``plugin`` on its address's host and ``port`` (not started: ``serve_forever``),
    with the plugin's certificate, a client certificate of the peers' CA required, and ``connection_limits``;
    ``set_upload_limits`` changes them."""
    handler = type("PeerHandler", (PeerRequestHandler,), {"service": service})
    host, _, _ = plugin.settings.address.rpartition(":")
    settings = plugin.settings
    tls = serving_tls("plugin peer port", settings.cert_file, settings.key_file, settings.peer_ca_file, True)
    limits = connection_limits(service.uploads.limit)
    address = (host.strip("[]"), port)
    return GuardedHTTPSServer(address, handler, tls, limits)


def set_upload_limits(uploads: UploadLimits, server: GuardedHTTPSServer | None, connections: int, rate: int) -> bool:
    """Apply new upload limits to ``uploads`` (and the bounds of the peer ``server``, when it runs); whether
    they changed. Transfers running go on, at the new rate; new ones count against the new limit."""
    changed = (connections, rate) != (uploads.limit, uploads.rate.bytes_per_second)
    uploads.set(connections, rate)
    if server is not None:
        server.limits = connection_limits(connections)
    return changed
