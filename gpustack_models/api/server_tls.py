"""The API's TLS: its serving certificate and key from files (``GPUSTACK_TLS_CERT_FILE``/``KEY_FILE``, e.g. a
cert-manager Secret), and the CAs of the client certificates it accepts from kube-apiserver's
``extension-apiserver-authentication`` ConfigMap (the requestheader CA of the front proxy, and the cluster's
client CA), watched (``authentication.requestheader``). New handshakes get a certificate renewed on disk and
a rotated CA without a restart (``serving_tls.ServingTLS``); connections already open keep theirs.

gunicorn builds the worker's listener context through its ``ssl_context`` hook (``gunicorn_conf``), which
returns ``listening_context()`` here. A failure there stops the worker: gunicorn would otherwise serve
plain HTTP on the port.
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


def gunicorn_ssl_context(conf, _default_factory) -> ssl.SSLContext:
    """gunicorn's ``ssl_context`` hook: the listener's context, switching each handshake to the current one."""
    try:
        return api_tls(conf.certfile, conf.keyfile).listening_context()
    except Exception:
        log.exception("the API's TLS context could not be built; stopping")
        sys.stderr.flush()
        raise SystemExit(WORKER_BOOT_ERROR) from None
