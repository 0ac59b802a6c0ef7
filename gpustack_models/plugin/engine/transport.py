"""HTTP for file bytes: keep-alive connections, an explicit proxy and CA bundle, manual redirects.

Built on ``http.client`` so a response body is read straight into the caller's buffer (no
intermediate copies, no per-chunk Python work beyond one call per buffer), which is what makes the
downloader as fast as the hub can send. Nothing is taken from the environment: the proxy and CA
bundle are the ticket's (``None``: direct, and the bundled public CA list), never
``HTTPS_PROXY``/``SSL_CERT_FILE`` and the like.

Redirects (301/302/303/307/308) are followed here, at most ``MAX_REDIRECTS`` hops. Credentials go
only to the origin they were given for: a hop to another origin (a CDN) gets no ``Authorization``
or ``Cookie`` header.

Every socket read has a timeout (``stall_timeout``): a response that sends no byte for that long
raises ``socket.timeout`` in the reader, which retries from its last written byte.
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

from gpustack_models.plugin.engine.ticket import origin, redact_url

MAX_REDIRECTS = 5
USER_AGENT = "gpustack-models-plugin/1"
_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_IDLE_PER_ORIGIN = 32


def _ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    if ca_bundle:
        return ssl.create_default_context(cafile=ca_bundle)
    try:
        import certifi

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi ships with requests
        return ssl.create_default_context()


def _quickack(conn: http.client.HTTPConnection) -> None:
    """Acknowledge the answer's first segment at once. A server that writes the status line and
    headers apart from the body (many do, Nagle's algorithm on) would otherwise hold the body back
    until our delayed ACK, some 40 ms, on every request of a kept-alive connection."""
    sock = conn.sock
    if _TCP_QUICKACK is not None and sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
        except OSError:
            pass


_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)


class HttpError(Exception):
    """A transport failure before an answer (connection refused or reset, TLS, proxy, ...).

    ``retryable`` is False for what another attempt cannot fix (a certificate that does not verify)."""

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


@dataclass(eq=False)
class StreamedResponse:
    """An answer whose body is still to be read (``readinto``) or discarded (``close``)."""

    status: int
    headers: http.client.HTTPMessage
    url: str
    _conn: http.client.HTTPConnection
    _resp: http.client.HTTPResponse
    _pool: ConnectionPool
    _key: tuple

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def length(self) -> int | None:
        """Body bytes still to come (``Content-Length`` minus what was read), if known."""
        return self._resp.length

    def readinto(self, buffer) -> int:
        """Fill ``buffer`` (a writable memoryview) with body bytes; fewer only at the end of the
        body. Raises ``http.client.IncompleteRead`` if the connection ends before the body does."""
        return self._resp.readinto(buffer)

    def close(self, *, reuse: bool = True) -> None:
        """Done with this answer: the connection goes back to the pool if the body was read to its
        end and the server keeps it alive, else it is closed."""
        resp, conn = self._resp, self._conn
        if reuse and not resp.will_close and resp.length == 0:
            resp.close()
            self._pool._put(self._key, conn)
        else:
            resp.close()
            conn.close()

    def abort(self) -> None:
        """Interrupt a read blocked in another thread (used by cancel) and drop the connection."""
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drain_small(self, limit: int = 64 * 1024) -> None:
        """Read and drop a small body (an error or redirect page) so the connection can be reused."""
        try:
            if self._resp.length is not None and self._resp.length <= limit:
                self._resp.read()
                self.close()
                return
        except (OSError, http.client.HTTPException):
            pass
        self.close(reuse=False)

    def text(self, limit: int = 4096) -> str:
        """A short prefix of the body (error pages), then the answer is closed."""
        try:
            data = self._resp.read(limit)
        except (OSError, http.client.HTTPException):
            data = b""
        self.close(reuse=False)
        return data.decode("utf-8", "replace")


class ConnectionPool:
    """Idle keep-alive connections per origin, for one proxy/CA setting. ``tls``, when given, makes the TLS
    context of each new connection instead (one presenting a client certificate, renewed meanwhile:
    connections already open keep the context they were made with)."""

    def __init__(
        self,
        *,
        proxy: str | None,
        ca_bundle: str | None,
        timeout: float,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ):
        self.proxy = proxy
        self.timeout = timeout
        self._ssl = None
        self._tls = tls
        self._ca_bundle = ca_bundle
        self._lock = threading.Lock()
        self._idle: dict[tuple, list[http.client.HTTPConnection]] = {}
        self._proxy_auth = None
        if proxy:
            parts = urlsplit(proxy)
            self._proxy_host, self._proxy_port = parts.hostname, parts.port or 80
            if parts.username is not None:
                credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
                self._proxy_auth = "Basic " + base64.b64encode(credentials).decode("ascii")

    def _context(self) -> ssl.SSLContext:
        if self._tls is not None:
            return self._tls()
        with self._lock:
            if self._ssl is None:
                self._ssl = _ssl_context(self._ca_bundle)
            return self._ssl

    def _new(self, key: tuple) -> http.client.HTTPConnection:
        scheme, host, port = key
        if self.proxy is None:
            if scheme == "https":
                return http.client.HTTPSConnection(host, port, timeout=self.timeout, context=self._context())
            return http.client.HTTPConnection(host, port, timeout=self.timeout)
        if scheme == "https":
            conn = http.client.HTTPSConnection(
                self._proxy_host, self._proxy_port, timeout=self.timeout, context=self._context()
            )
            tunnel_headers = {"Proxy-Authorization": self._proxy_auth} if self._proxy_auth else None
            conn.set_tunnel(host, port, headers=tunnel_headers)
            return conn
        return http.client.HTTPConnection(self._proxy_host, self._proxy_port, timeout=self.timeout)

    def _get(self, key: tuple) -> http.client.HTTPConnection:
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                return idle.pop()
        return self._new(key)

    def _put(self, key: tuple, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < _MAX_IDLE_PER_ORIGIN:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    # ---------------------------------------------------------------- requests

    def _send(self, url: str, headers: Mapping[str, str]) -> StreamedResponse:
        key = origin(url)
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if self.proxy is not None and key[0] == "http":
            target = url  # a plain-HTTP proxy takes the absolute URL
        all_headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **headers}
        if self.proxy is not None and key[0] == "http" and self._proxy_auth:
            all_headers["Proxy-Authorization"] = self._proxy_auth
        for attempt in (0, 1):
            conn = self._get(key)
            reused = conn.sock is not None
            try:
                conn.request("GET", target, headers=all_headers)
                _quickack(conn)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and attempt == 0 and isinstance(exc, (http.client.RemoteDisconnected, ConnectionError)):
                    continue  # a keep-alive connection the server had closed meanwhile: once more, fresh
                where = f"{key[0]}://{key[1]}:{key[2]}"
                via = f" via proxy {redact_url(self.proxy)}" if self.proxy else ""
                retryable = not isinstance(exc, ssl.SSLCertVerificationError)
                raise HttpError(f"GET {where}{via}: {type(exc).__name__}: {exc}", retryable=retryable) from None
            return StreamedResponse(resp.status, resp.headers, url, conn, resp, self, key)
        raise AssertionError("unreachable")

    def get(self, url: str, *, credentials: Mapping[str, str], credentials_origin: tuple, headers: Mapping[str, str]):
        """GET ``url`` following redirects; ``credentials`` headers only on ``credentials_origin``.

        Returns the final non-redirect ``StreamedResponse`` (its ``url`` is where the bytes came from)."""
        for _ in range(MAX_REDIRECTS + 1):
            hop_headers = dict(headers)
            if origin(url) == credentials_origin:
                hop_headers.update(credentials)
            response = self._send(url, hop_headers)
            if response.status not in _REDIRECTS:
                return response
            location = response.header("Location")
            response.drain_small()
            if not location:
                raise HttpError(f"HTTP {response.status} redirect without a Location")
            url = urljoin(url, location)
            if urlsplit(url).scheme not in ("http", "https"):
                raise HttpError("redirect to a non-HTTP location")
        raise HttpError(f"more than {MAX_REDIRECTS} redirects")
