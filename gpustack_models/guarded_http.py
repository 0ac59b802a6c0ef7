"""An HTTP/1.1 server for ports anyone on the network may reach: a thread per connection, deadlines for
everything a client may hold open, and a bound on the connections open at once. The plugin's HTTPS
endpoints (``plugin.https_server``, TLS over this) and the roles' plain metrics ports
(``telemetry.registry``) are served by it; it imports nothing of the product.

- The accept loop only accepts: it never reads from a client, so a client that connects and sends
  nothing holds its own thread, never the loop.
- A request's line and headers must arrive whole within ``ConnectionLimits.request`` seconds (the first
  request counting from the accept, or from the TLS handshake's end; later ones from their first byte),
  however slowly they trickle in: the deadline is for the whole head, not for each read. Writing the
  answer gets ``ConnectionLimits.request`` too (each write whole within it, however slowly the client reads).
- A keep-alive connection waits ``ConnectionLimits.idle`` seconds at most for its next request.
- At most ``ConnectionLimits.connections`` connections are open at once; one accepted beyond that is closed
  at once, without a byte read or written.
"""

from __future__ import annotations

import io
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    handshake: float = 5.0  # seconds for the whole TLS handshake (TLS servers only)
    request: float = 10.0  # seconds for a request's line and headers, and again to write its answer
    idle: float = 75.0  # seconds a keep-alive connection waits for its next request
    connections: int = 128  # connections open at once (handshaking, reading, answering or idle)


class _DeadlineReader(io.RawIOBase):
    """The connection's bytes, read under a deadline that the next request resets, not each read."""

    def __init__(self, sock: socket.socket, limits: ConnectionLimits):
        self._sock, self._limits = sock, limits
        self._deadline = time.monotonic() + limits.request  # the first request: from the accept (or handshake)
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


class GuardedHTTPServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with ``ConnectionLimits``: the bound on open connections kept by the accept
    loop, the deadlines by ``GuardedRequestHandler``."""

    daemon_threads = True
    block_on_close = False  # closing the server does not wait for its connections' threads
    request_queue_size = 128  # a burst of connections waits in the kernel's queue, not in SYN retries
    logger = log  # where the warning of a full server goes

    def __init__(self, address, handler, limits: ConnectionLimits):
        self.limits = limits
        self.open = 0  # connections accepted and not yet closed (each holds a thread)
        self._lock = threading.Lock()
        self._warned = float("-inf")
        super().__init__(address, handler)
        self.socket.setblocking(False)  # accept() never waits: a connection gone meanwhile is an OSError

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
            self.logger.warning(
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

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # a timeout, a reset, a failed handshake: the client's doing
            self.logger.debug("connection from %s: %s", client_address[0], error)
        else:
            self.logger.exception("serving a connection from %s", client_address[0])
