"""The node plugins' certificates, issued by the API: ``POST /internal/v1/plugin-certificates``.

Every plugin serves HTTPS on its Pod IP (its main and peer ports) with a certificate of the plugin CA
(``GPUSTACK_PLUGIN_CA_FILE``), which the API and the other plugins trust. Nodes come and go, so a
plugin asks for its certificate when it starts, and again at two thirds of its validity; the CA's
private key (``GPUSTACK_PLUGIN_CA_KEY_FILE``) is only in the API's Pods, never on a node: a node that
held it could name any Pod's IP.

The body is JSON ``{"csr": "<PEM request>", "clientCsr": "<PEM request>"}`` (at most ``MAX_BODY_BYTES``:
413 beyond): one request for the serving certificate, one for the client certificate the plugin presents to
its peers, each for a key of its own (400 for the same key twice). ``clientCsr`` may be left out (a plugin
of an earlier version): then no client certificate is issued. The caller is authorized from the cluster,
each refusal a ``Status``, in this order:

1. a bearer token (401 without one, or one kube-apiserver refuses), of the plugins' ServiceAccount (403
   otherwise), bound to a Pod (403 for a token with no ``pod-name``, ``pod-uid`` and ``node-name``);
2. this API process holds the CA key (503 otherwise, saying so);
3. the requests (400 naming the field: not one PEM request, a signature that does not verify, a key other
   than RSA of 2048-4096 bits or EC P-256; see ``signing``);
4. the Pod the token is bound to, read live in the service's namespace: it exists with the token's uid
   (404), runs the plugins' ServiceAccount on the token's node (403), and is Running with an IP (409).

The answer is ``{"certificate": "<PEM>", "clientCertificate": "<PEM>", "ca": "<PEM of
GPUSTACK_PLUGIN_CA_FILE>"}``, both for ``GPUSTACK_PLUGIN_CERT_SECONDS``: the serving certificate names the
Pod's IPs alone, whatever the request asked for, and may only serve TLS; the client certificate names the
token's node (``system:gpustack-models-plugin:<node>``) and may only authenticate a TLS client (see
``signing``).
"""

from __future__ import annotations

import datetime
import logging
import threading

from cryptography.hazmat.primitives import serialization
from django.conf import settings
from rest_framework.response import Response

from gpustack_models import kube
from gpustack_models.api.authentication import TokenReviewAuthentication
from gpustack_models.api.parsers import JSONParser
from gpustack_models.api.views import KubeAPIView
from gpustack_models.file_stamps import file_stamps
from gpustack_models.internal.signing import (
    Authority,
    SigningRequestError,
    load_authority,
    load_request,
    pod_addresses,
)
from gpustack_models.internal.tickets import BoundPlugin
from gpustack_models.kube.errors import Forbidden, NotFound
from gpustack_models.kube.identity import NODE_NAME_EXTRA

log = logging.getLogger(__name__)

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
MAX_BODY_BYTES = 16 * 1024  # an RSA-4096 request is under 2 KiB; two of them, well under this


class SigningRequestParser(JSONParser):
    max_bytes = MAX_BODY_BYTES


class _AuthorityCache:
    """The CA as last loaded, loaded again when either file changes (a rotated Secret)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._authority: Authority | None = None

    def get(self) -> Authority:
        cert_file, key_file = settings.PLUGIN_CA_FILE, settings.PLUGIN_CA_KEY_FILE
        stamp = (cert_file, key_file, file_stamps(cert_file, key_file))
        with self._lock:
            if stamp != self._stamp or self._authority is None:
                self._authority, self._stamp = None, None
                self._authority = load_authority(cert_file, key_file)  # 503 when it cannot
                self._stamp = stamp
            return self._authority


authority = _AuthorityCache()


def bound_pod(user) -> tuple[str, str, str]:
    """(node, Pod name, Pod uid) of a Pod-bound token; 403 for any other."""
    extra = user.extra_dict
    values = [extra.get(key) or [] for key in (NODE_NAME_EXTRA, POD_NAME_EXTRA, POD_UID_EXTRA)]
    if any(len(v) != 1 or not v[0] for v in values):
        raise Forbidden("this token is not bound to a Pod: use the plugin Pod's own ServiceAccount token")
    node, name, uid = (v[0] for v in values)
    return node, name, uid


def read_pod(node: str, name: str, uid: str) -> dict:
    """The Pod the token is bound to, read live, if it is the plugin's on the token's node."""
    named = f"pod {settings.NAMESPACE}/{name}"
    try:
        pod = kube.default().get(f"/api/v1/namespaces/{settings.NAMESPACE}/pods/{name}")
    except kube.NotFound:
        raise NotFound(f"{named}, which the token is bound to, does not exist") from None
    if (pod.get("metadata") or {}).get("uid") != uid:
        raise NotFound(f"{named} of uid {uid}, which the token is bound to, does not exist")
    spec = pod.get("spec") or {}
    if spec.get("nodeName") != node:
        raise Forbidden(f"{named} is not on node {node}")
    if (spec.get("serviceAccountName") or "default") != settings.PLUGIN_SERVICE_ACCOUNT:
        raise Forbidden(f"{named} does not run as the plugins' ServiceAccount")
    return pod


class PluginCertificateView(KubeAPIView):
    authentication_classes = [TokenReviewAuthentication]
    permission_classes = [BoundPlugin]
    parser_classes = [SigningRequestParser]

    def post(self, request):
        node, name, uid = bound_pod(request.user)
        ca = authority.get()
        csr, client_csr = requests_of(request.data)
        addresses = pod_addresses(read_pod(node, name, uid))
        now = datetime.datetime.now(datetime.UTC)  # one moment for both: they end together, to the second
        cert = ca.issue(csr.public_key(), node, addresses, settings.PLUGIN_CERT_SECONDS, now)
        answer = {"certificate": _pem(cert), "ca": ca.bundle_pem.decode()}
        if client_csr is not None:
            client = ca.issue_client(client_csr.public_key(), node, settings.PLUGIN_CERT_SECONDS, now)
            answer["clientCertificate"] = _pem(client)
        log.info(
            "issued plugin certificate %x%s for node %s, pod %s (uid %s), IPs %s, until %s",
            cert.serial_number, f" and client certificate {client.serial_number:x}" if client_csr else "",
            node, name, uid, ",".join(addresses), cert.not_valid_after_utc.isoformat(),
        )  # fmt: skip
        return Response(answer)


def requests_of(data) -> tuple:
    """The serving request (``csr``) and the client one (``clientCsr``, or ``None`` when left out), each
    checked; 400 naming the field at fault, and for one key asked for twice."""
    if not isinstance(data, dict):
        raise SigningRequestError('expected a JSON body {"csr": "<PEM request>", "clientCsr": "<PEM request>"}')
    csr = load_request(data.get("csr"), "csr")
    if data.get("clientCsr") is None:
        return csr, None
    client = load_request(data.get("clientCsr"), "clientCsr")
    if _spki(client.public_key()) == _spki(csr.public_key()):
        raise SigningRequestError("clientCsr: the client certificate needs a key of its own, not the serving key")
    return csr, client


def _spki(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _pem(cert) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()
