"""The plugin's HTTPS server: a thread per connection, the TLS handshake on that thread, deadlines for
everything a client may hold open, and a bound on the connections open at once.

- The accept loop only accepts: it never reads from a client, so a client that connects and sends
  nothing (or half a handshake) holds its own thread, never the loop.
- The TLS handshake must end within ``ConnectionLimits.handshake`` seconds of the accept.
- A request's line and headers must arrive whole within ``ConnectionLimits.request`` seconds (the first
  request counting from the handshake, later ones from their first byte), however slowly they trickle in:
  the deadline is for the whole head, not for each read. Writing the answer gets ``ConnectionLimits.request``
  too.
- A keep-alive connection waits ``ConnectionLimits.idle`` seconds at most for its next request: longer than
  the API keeps an idle connection to a plugin (60 s), so the API closes first and never sends a request on
  a connection closing under it.
- At most ``ConnectionLimits.connections`` connections are open at once; one accepted beyond that is closed at
  once, without a byte read or written.

Who calls: no bearer token is ever taken. A caller presents a client certificate of the plugin CA
(``server_context`` with ``client_ca``: required on the peer port, asked for on the main port, whose probes
come without one); ``client_name`` is its subject's CN when the handshake verified it against that CA and
it may authenticate a client (ExtendedKeyUsage ``clientAuth``): ``PLUGIN_SUBJECT_PREFIX`` + a node's name
for a node's plugin, ``SERVICE_SUBJECT`` for the API. A serving certificate of the same CA is no client's.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

log = logging.getLogger(__name__)

PLUGIN_SUBJECT_PREFIX = "system:gpustack-models-plugin:"  # + the node's name: a node's plugin
SERVICE_SUBJECT = "system:gpustack-models-service"  # the API, reading live bytes


@dataclass(frozen=True)
class ConnectionLimits:
    handshake: float = 5.0  # seconds for the whole TLS handshake
    request: float = 10.0  # seconds for a request's line and headers, and again to write its answer
    idle: float = 75.0  # seconds a keep-alive connection waits for its next request
    connections: int = 128  # connections open at once (handshaking, reading, answering or idle)


def status(code: int, reason: str, message: str = "") -> bytes:
    """A Kubernetes ``Status`` body of a failure, the answer to a request the plugin's servers refuse."""
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason}
    if message:
        body["message"] = message
    return json.dumps(body).encode()


def server_context(
    cert_file: str, key_file: str, client_ca: str | None = None, require_client: bool = False
) -> ssl.SSLContext:
    """A TLS server context with the certificate and key of these files. With ``client_ca``, client
    certificates are verified against it: asked for (a client without one still connects), or required
    (``require_client``: no handshake without one). A client certificate that does not verify, of another CA
    or for another purpose, ends the handshake either way."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    if client_ca:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED if require_client else ssl.CERT_OPTIONAL
    return context


def client_name(connection) -> str | None:
    """The subject CN of the client certificate of ``connection`` (a server-side TLS socket), if the
    handshake verified it against the client CA and it may authenticate a TLS client (ExtendedKeyUsage
    ``clientAuth``); ``None`` for no certificate, one without ``clientAuth`` (a serving certificate), or a
    subject of no single CN."""
    try:
        verified = connection.getpeercert()  # {} or None unless the chain verified
        der = connection.getpeercert(binary_form=True)
    except (AttributeError, ValueError, OSError):
        return None
    if not verified or not der:
        return None
    try:
        usages = x509.load_der_x509_certificate(der).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        return None
    names = [value for rdn in verified.get("subject", ()) for key, value in rdn if key == "commonName"]
    return names[0] if len(names) == 1 and names[0] else None


class _DeadlineReader(io.RawIOBase):
    """The connection's bytes, read under a deadline that the next request resets, not each read."""

    def __init__(self, sock: socket.socket, limits: ConnectionLimits):
        self._sock, self._limits = sock, limits
        self._deadline = time.monotonic() + limits.request  # the first request: from the handshake's end
        self._waiting = False

    def readable(self) -> bool:
        return True

    def next_request(self) -> None:
        """Wait ``idle`` seconds for the next request's first byte, then ``request`` for the rest."""
        self._deadline = time.monotonic() + self._limits.idle
        self._waiting = True

    def readinto(self, buffer) -> int:
        timeout = self._deadline - time.monotonic()
        if timeout <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._sock.settimeout(timeout)
        count = self._sock.recv_into(buffer)
        if count and self._waiting:
            self._deadline, self._waiting = time.monotonic() + self._limits.request, False
        return count


class GuardedRequestHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, each request under the server's ``ConnectionLimits``."""

    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.rfile.close()  # the plain file of the socket: read through the deadline instead
        self._reader = _DeadlineReader(self.connection, self.server.limits)
        self.rfile = io.BufferedReader(self._reader)
        self._requests = 0

    def handle_one_request(self):
        if self._requests:
            self._reader.next_request()
        self._requests += 1
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()  # reads the headers
        self.connection.settimeout(self.server.limits.request)  # for writing the answer
        return ok


class GuardedHTTPSServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` over TLS with the handshake off the accept loop, and ``ConnectionLimits``."""

    daemon_threads = True
    block_on_close = False  # closing the server does not wait for its connections' threads
    request_queue_size = 128  # a burst of connections waits in the kernel's queue, not in SYN retries

    def __init__(
        self,
        address,
        handler,
        context: ssl.SSLContext,
        limits: ConnectionLimits,
        client_ca: str | None = None,
        require_client: bool = False,
    ):
        self.context, self.limits = context, limits
        self.client_ca, self.require_client = client_ca, require_client  # kept by a renewed certificate
        self.open = 0  # connections accepted and not yet closed (each holds a thread)
        self._lock = threading.Lock()
        self._warned = float("-inf")
        super().__init__(address, handler)
        self.socket.setblocking(False)  # accept() never waits: a connection gone meanwhile is an OSError

    def load_certificate(self, cert_file: str, key_file: str) -> None:
        """Serve new connections with this certificate (a renewed one); open connections keep theirs."""
        self.context = server_context(cert_file, key_file, self.client_ca, self.require_client)

    def process_request(self, request, client_address):
        with self._lock:
            taken = self.open < self.limits.connections
            if taken:
                self.open += 1
        if not taken:
            self._refuse(request, client_address)
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        with self._lock:
            self.open -= 1

    def _refuse(self, request, client_address) -> None:
        now = time.monotonic()
        if now - self._warned >= 60:
            self._warned = now
            log.warning(
                "%d connections open, the most allowed: closing new ones (from %s, ...)",
                self.limits.connections,
                client_address[0],
            )
        self.shutdown_request(request)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def finish_request(self, request, client_address):
        """On the connection's thread: the TLS handshake, then the requests."""
        request.settimeout(self.limits.handshake)  # for the whole handshake, not each read
        tls = self.context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            self.shutdown_request(tls)

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # a timeout, a reset, a failed handshake: the client's doing
            log.debug("connection from %s: %s", client_address[0], error)
        else:
            log.exception("serving a connection from %s", client_address[0])
