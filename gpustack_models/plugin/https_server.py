"""The plugin's HTTPS server: ``guarded_http``'s server with the TLS handshake on each connection's thread.

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
"""

from __future__ import annotations

import json
import logging
import ssl

from gpustack_models.guarded_http import ConnectionLimits, GuardedHTTPServer, GuardedRequestHandler

__all__ = [
    "ConnectionLimits",
    "GuardedHTTPSServer",
    "GuardedRequestHandler",
    "server_context",
    "status",
]

log = logging.getLogger(__name__)


def status(code: int, reason: str, message: str = "") -> bytes:
    """A Kubernetes ``Status`` body of a failure, the answer to a request the plugin's servers refuse."""
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason}
    if message:
        body["message"] = message
    return json.dumps(body).encode()


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS server context with the certificate and key of these files; no client certificate asked for."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context


class GuardedHTTPSServer(GuardedHTTPServer):
    """``GuardedHTTPServer`` over TLS, the handshake off the accept loop under ``ConnectionLimits.handshake``."""

    logger = log

    def __init__(self, address, handler, context: ssl.SSLContext, limits: ConnectionLimits):
        self.context = context
        super().__init__(address, handler, limits)

    def load_certificate(self, cert_file: str, key_file: str) -> None:
        """Serve new connections with this certificate (a renewed one); open connections keep theirs."""
        self.context = server_context(cert_file, key_file)

    def finish_request(self, request, client_address):
        """On the connection's thread: the TLS handshake, then the requests."""
        request.settimeout(self.limits.handshake)  # for the whole handshake, not each read
        tls = self.context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            self.shutdown_request(tls)
