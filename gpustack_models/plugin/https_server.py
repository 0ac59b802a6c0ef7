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

Who calls: no bearer token is ever taken. A caller presents a client certificate of the plugin CA
(``server_context`` with ``client_ca``: required on the peer port, asked for on the main port, whose probes
come without one); ``client_name`` is its subject's CN when the handshake verified it against that CA and
it may authenticate a client (ExtendedKeyUsage ``clientAuth``): ``PLUGIN_SUBJECT_PREFIX`` + a node's name
for a node's plugin, ``SERVICE_SUBJECT`` for the API. A serving certificate of the same CA is no client's.
"""

from __future__ import annotations

import json
import logging
import ssl

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from gpustack_models.guarded_http import ConnectionLimits, GuardedHTTPServer, GuardedRequestHandler
from gpustack_models.serving_tls import ServingTLS

__all__ = [
    "ConnectionLimits",
    "GuardedHTTPSServer",
    "GuardedRequestHandler",
    "client_name",
    "server_context",
    "serving_tls",
    "status",
]

log = logging.getLogger(__name__)

PLUGIN_SUBJECT_PREFIX = "system:gpustack-models-plugin:"  # + the node's name: a node's plugin
SERVICE_SUBJECT = "system:gpustack-models-service"  # the API, reading live bytes


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


def serving_tls(
    name: str, cert_file: str, key_file: str, client_ca: str | None = None, require_client: bool = False
) -> ServingTLS:
    """``server_context`` kept current: rebuilt for new connections when the certificate, the key or the
    client CA file changes (a renewed certificate, a rotated CA ConfigMap); open connections keep theirs."""
    return ServingTLS(
        name,
        cert_file,
        key_file,
        lambda: server_context(cert_file, key_file, client_ca, require_client),
        trusted=(client_ca,) if client_ca else (),
    )


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


class GuardedHTTPSServer(GuardedHTTPServer):
    """``GuardedHTTPServer`` over TLS, the handshake off the accept loop under ``ConnectionLimits.handshake``."""

    logger = log

    def __init__(
        self,
        address,
        handler,
        tls: ServingTLS,
        limits: ConnectionLimits,
    ):
        self.tls = tls
        super().__init__(address, handler, limits)

    def load_certificate(self) -> None:
        """Load changed certificate files now (a renewed certificate) rather than at the next connection."""
        self.tls.current()

    def finish_request(self, request, client_address):
        """On the connection's thread: the TLS handshake, then the requests."""
        request.settimeout(self.limits.handshake)  # for the whole handshake, not each read
        tls = self.tls.current().wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            self.shutdown_request(tls)
