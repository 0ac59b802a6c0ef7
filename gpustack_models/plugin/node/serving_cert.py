"""The plugin's serving and client certificates, issued by the API (``GPUSTACK_PLUGIN_CERT_FROM_API``).

The plugin makes two EC P-256 keys, sends a signing request for each to the API in one request
(``POST /internal/v1/plugin-certificates``, ``csr`` and ``clientCsr``, with its Pod-bound token and the
API's CA, as for fetch tickets) and gets back two certificates of the plugin CA: one naming its Pod IP, to
serve TLS, one naming its node, to present to its peers (``clientAuth`` only). Keys and certificates are
written to its directory (``serving.*``, ``client.*``; mode 0600, each replaced in one rename); both HTTPS
servers (the main port and the peer port) serve the first, the downloads' peer connections present the
second (``peers.contract.ClientCertificate``). At two thirds of the validity it asks again with new keys;
the servers take the new certificate for new connections (connections already open keep theirs), and so
do the peer connections.

At start, an API that cannot be reached (or refuses) is asked again with backoff, every failure
logged; the servers do not start, so nothing is served without TLS and ``/readyz`` answers nothing,
until a certificate is in place. No Django here.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpustack_models.private_files import write_private

log = logging.getLogger(__name__)

PATH = "/internal/v1/plugin-certificates"
RETRY_FIRST, RETRY_MAX = 1.0, 60.0  # seconds between attempts, doubling
RENEW_AT = 2 / 3  # of the validity left when the certificate arrived


def client_files(directory: str | Path) -> tuple[str, str]:
    """Where the client certificate and its key are kept in the plugin's certificate directory."""
    return str(Path(directory) / "client.crt"), str(Path(directory) / "client.key")


class CertificateRefused(RuntimeError):
    """The API's answer was no certificate for our key."""


def signing_request(key, node: str) -> str:
    """A PEM signing request for ``key`` (its subject is only informative: the API names the Pod IP)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node[:64])])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode()


class ServingCertificate:
    """The serving and client certificates and key files the API issues, kept current."""

    def __init__(self, directory: str, node: str, api_url: str, api_ca_file: str, auth_headers: Callable):
        self.directory = Path(directory)
        self.cert_file, self.key_file = str(self.directory / "serving.crt"), str(self.directory / "serving.key")
        self.client_cert_file, self.client_key_file = client_files(directory)
        self.node, self.api_url, self.api_ca_file = node, api_url.rstrip("/"), api_ca_file
        self.auth_headers = auth_headers
        self.renew_time = 0.0  # time.time() when to ask again
        self.listeners: list[Callable[[], None]] = []  # called after a new certificate is in place

    def request(self) -> None:
        """Ask once: new keys, their certificates, the files written. Raises on any failure."""
        key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        session = requests.Session()
        session.trust_env = False
        resp = session.post(
            f"{self.api_url}{PATH}",
            json={"csr": signing_request(key, self.node), "clientCsr": signing_request(client_key, self.node)},
            headers=self.auth_headers(),
            verify=self.api_ca_file,
            timeout=30,
        )
        if resp.status_code != 200:
            raise CertificateRefused(f"the API answered {resp.status_code}: {_message(resp)}")
        answer = resp.json()
        if not answer.get("clientCertificate"):
            raise CertificateRefused("the API issued no client certificate (an API of an earlier version)")
        cert = x509.load_pem_x509_certificate(answer["certificate"].encode())
        client = x509.load_pem_x509_certificate(answer["clientCertificate"].encode())
        if _spki(cert.public_key()) != _spki(key.public_key()) or _spki(client.public_key()) != _spki(
            client_key.public_key()
        ):
            raise CertificateRefused("the API's certificates are not for the keys sent")
        self._install((key, cert), (client_key, client))

    def _install(self, serving: tuple, client: tuple) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for (key, cert), (cert_file, key_file) in (
            (serving, (self.cert_file, self.key_file)),
            (client, (self.client_cert_file, self.client_key_file)),
        ):
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            write_private(Path(key_file), pem)  # the pair is loaded after both are written
            write_private(Path(cert_file), cert.public_bytes(serialization.Encoding.PEM))
        cert = serving[1]
        now = datetime.datetime.now(datetime.UTC)
        start = max(now, cert.not_valid_before_utc)
        self.renew_time = start.timestamp() + RENEW_AT * max(0.0, (cert.not_valid_after_utc - start).total_seconds())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        log.info(
            "serving certificate %x and client certificate %x from the API for %s, until %s; renewing at %s",
            cert.serial_number,
            client[1].serial_number,
            ", ".join(str(ip) for ip in names.get_values_for_type(x509.IPAddress)),
            cert.not_valid_after_utc.isoformat(),
            datetime.datetime.fromtimestamp(self.renew_time, datetime.UTC).isoformat(),
        )

    def obtain(self, stopping: threading.Event) -> bool:
        """Until a certificate is in place (True) or ``stopping`` is set (False), asking with backoff."""
        wait = RETRY_FIRST
        while not stopping.is_set():
            try:
                self.request()
                return True
            except Exception as exc:  # unreachable, refused, a bad answer: ask again
                log.warning("no serving certificate from the API yet (%s); asking again in %.0f s", exc, wait)
            if stopping.wait(wait):
                break
            wait = min(wait * 2, RETRY_MAX)
        return False

    def renew_forever(self, stopping: threading.Event) -> None:
        """At each renewal time, a new certificate (with backoff while the API refuses), then the
        listeners (the servers load it)."""
        while not stopping.wait(max(0.0, self.renew_time - time.time())):
            if not self.obtain(stopping):
                return
            for listener in self.listeners:
                try:
                    listener()
                except Exception:  # one server failing to load must not stop the renewals
                    log.exception("loading the renewed certificates")


def _message(resp) -> str:
    try:
        return str(resp.json().get("message") or resp.text[:200])
    except ValueError:
        return resp.text[:200]


def _spki(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
