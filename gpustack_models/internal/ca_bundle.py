"""The CA certificates nodes trust, published by the API in a ConfigMap that holds no key.

Kubernetes' Node authorizer lets a node read every Secret its Pods reference, whole (a volume's ``items``
limits only what is mounted), so no Secret a plugin Pod mounts may hold key material: the plugins read their
CAs from the ConfigMap ``GPUSTACK_CA_CONFIGMAP`` of the service's namespace instead, keys ``api-ca.crt`` (the CA
of the API's serving certificate, ``GPUSTACK_API_SERVING_CA_FILE``) and ``plugin-ca.crt`` (the plugin CA,
``GPUSTACK_PLUGIN_CA_FILE``). With generated certificates the chart renders that ConfigMap; with cert-manager
(which keeps each CA in a Secret beside its key) the API publishes it here: at start and whenever either file
changes (a renewed CA), checked every ``POLL_SECONDS``.

Only certificates are published: a file holding a ``PRIVATE KEY`` block, or anything that is not one or more PEM
certificates, is refused whole (logged, nothing written), and what is written is the certificates re-encoded
from their parsed form, so nothing else of the file travels. Every API process publishes (``start``, once per
process); the object is the same whoever writes it, so several replicas agree (server-side apply, one field
manager), and an unchanged ConfigMap is not written again.
"""

from __future__ import annotations

import logging
import threading

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from django.conf import settings

from gpustack_models import kube
from gpustack_models.file_stamps import file_stamps

log = logging.getLogger(__name__)

API_CA_KEY, PLUGIN_CA_KEY = "api-ca.crt", "plugin-ca.crt"
FIELD_MANAGER = "gpustack-models-api"
POLL_SECONDS = 10.0
MAX_BYTES = 256 * 1024  # a CA bundle of a few certificates is a few KiB


class NotCertificates(ValueError):
    """A file that is not only PEM certificates (or holds a private key): nothing of it is published."""


def certificates_of(path: str) -> str:
    """The PEM certificates of the file at ``path``, re-encoded; ``NotCertificates`` for a file holding a
    private key, no certificate, or anything that does not parse."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise NotCertificates(f"{path} is larger than {MAX_BYTES} bytes: not a CA bundle")
    if b"PRIVATE KEY" in raw:
        raise NotCertificates(f"{path} holds a private key: it is never published")
    try:
        certs = x509.load_pem_x509_certificates(raw)
    except ValueError as exc:
        raise NotCertificates(f"{path} does not hold PEM certificates only: {exc}") from None
    return "".join(cert.public_bytes(serialization.Encoding.PEM).decode() for cert in certs)


def configmap(name: str, namespace: str, api_ca: str, plugin_ca: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "gpustack-models", "app.kubernetes.io/managed-by": FIELD_MANAGER},
        },
        "data": {API_CA_KEY: api_ca, PLUGIN_CA_KEY: plugin_ca},
    }


def publish(client: kube.Kube, name: str, namespace: str, api_ca_file: str, plugin_ca_file: str) -> str:
    """Write the ConfigMap from the two files: ``"created"``, ``"updated"`` or ``"unchanged"``. Raises
    ``NotCertificates`` (nothing written) or the cluster's ``StatusError``."""
    wanted = configmap(name, namespace, certificates_of(api_ca_file), certificates_of(plugin_ca_file))
    path = f"/api/v1/namespaces/{namespace}/configmaps/{name}"
    try:
        current = client.get(path)
    except kube.NotFound:
        current = None
    if current is not None and (current.get("data") or {}) == wanted["data"]:
        return "unchanged"
    client.apply(path, wanted, field_manager=FIELD_MANAGER)
    return "created" if current is None else "updated"


class Publisher:
    """Publishes at start and when either file changes (or the last attempt failed), until stopped."""

    def __init__(self, client, name: str, namespace: str, api_ca_file: str, plugin_ca_file: str):
        self.client, self.name, self.namespace = client, name, namespace  # client: a callable returning a Kube
        self.files = (api_ca_file, plugin_ca_file)
        self.stopping = threading.Event()
        self._published: tuple | None = None  # the files' stamps when last published

    def once(self) -> str | None:
        """Publish if the files changed since the last success; what ``publish`` said, ``None`` otherwise."""
        stamps = file_stamps(*self.files)
        if stamps == self._published:
            return None
        try:
            result = publish(self.client(), self.name, self.namespace, *self.files)
        except (OSError, NotCertificates, kube.StatusError) as exc:
            log.warning("CA ConfigMap %s/%s not published: %s", self.namespace, self.name, exc)
            return None
        self._published = stamps
        if result != "unchanged":
            log.info("CA ConfigMap %s/%s %s from %s", self.namespace, self.name, result, ", ".join(self.files))
        return result

    def run(self) -> None:
        while True:
            try:
                self.once()
            except Exception:  # the cluster unreachable, say: the next poll tries again
                log.exception("publishing the CA ConfigMap")
            if self.stopping.wait(POLL_SECONDS):
                return


_started: Publisher | None = None
_lock = threading.Lock()


def start() -> Publisher | None:
    """This process's publisher, started once, when ``GPUSTACK_CA_CONFIGMAP`` names a ConfigMap."""
    global _started
    if not settings.CA_CONFIGMAP:
        return None
    with _lock:
        if _started is None:
            _started = Publisher(
                kube.default, settings.CA_CONFIGMAP, settings.NAMESPACE, settings.API_SERVING_CA_FILE,
                settings.PLUGIN_CA_FILE,
            )  # fmt: skip
            threading.Thread(target=_started.run, name="ca-configmap", daemon=True).start()
        return _started
