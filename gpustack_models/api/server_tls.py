"""The API's TLS: its serving certificate and key from files (``GPUSTACK_TLS_CERT_FILE``/``KEY_FILE``, e.g. a
cert-manager Secret), and the CAs of the client certificates it accepts from kube-apiserver's
``extension-apiserver-authentication`` ConfigMap (the requestheader CA of the front proxy, and the cluster's
client CA), watched (``authentication.requestheader``). New handshakes get a certificate renewed on disk and
a rotated CA without a restart (``serving_tls.ServingTLS``); connections already open keep theirs.

The API's gunicorn worker (``server.TLSASGIWorker``) takes its listener's context from ``worker_ssl_context``:
``listening_context()``. A failure there stops the worker: gunicorn's own method would serve plain HTTP on
the port instead.
"""

from __future__ import annotations

import logging
import ssl
import sys

from gpustack_models.api.authentication import RequestHeaderConfig, RequestHeaderSource, requestheader
from gpustack_models.serving_tls import ServingTLS

log = logging.getLogger(__name__)

WORKER_BOOT_ERROR = 3  # gunicorn's exit status for a worker that cannot start: the arbiter stops


def client_ca_pem(config: RequestHeaderConfig) -> str:
    """The CAs of accepted client certificates: the front proxy's, and the cluster's client CA, so a
    direct caller's certificate is not refused at the handshake (it is then ignored unless it chains to the
    requestheader CA, checked per request)."""
    return "\n".join(pem for pem in (config.requestheader_ca_pem, config.client_ca_pem) if pem.strip())


def api_tls(cert_file: str, key_file: str, source: RequestHeaderSource = requestheader) -> ServingTLS:
    """The API's serving context, rebuilt when its certificate or key file or the ConfigMap's CAs change."""

    def build() -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        cadata = client_ca_pem(source.current())
        if cadata:
            context.load_verify_locations(cadata=cadata)
        context.verify_mode = ssl.CERT_OPTIONAL  # asked for, not required: tokens authenticate too
        return context

    return ServingTLS("API", cert_file, key_file, build, version=lambda: client_ca_pem(source.current()))


def worker_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A worker's listener context, switching each handshake to the current one; exits when it cannot be built."""
    try:
        return api_tls(cert_file, key_file).listening_context()
    except Exception:
        log.exception("the API's TLS context could not be built; stopping")
        sys.stderr.flush()
        raise SystemExit(WORKER_BOOT_ERROR) from None
