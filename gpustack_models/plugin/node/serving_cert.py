"""The plugin's serving certificate, issued by the API (``GPUSTACK_PLUGIN_CERT_FROM_API``).

The plugin makes an EC P-256 key, sends a signing request for it to the API
(``POST /internal/v1/plugin-certificates``, with its Pod-bound token and the API's CA, as for fetch
tickets) and gets back a certificate of the plugin CA naming its Pod IP. Key and certificate are written
to its directory (mode 0600, each replaced in one rename), and both HTTPS servers (the main port and the
peer port) use them. At two thirds of the certificate's validity it asks again with a new key and the
servers take the new certificate for new connections (connections already open keep theirs).

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

log = logging.getLogger(__name__)

PATH = "/internal/v1/plugin-certificates"
RETRY_FIRST, RETRY_MAX = 1.0, 60.0  # seconds between attempts, doubling
RENEW_AT = 2 / 3  # of the validity left when the certificate arrived


class CertificateRefused(RuntimeError):
    """The API's answer was no certificate for our key."""


def signing_request(key, node: str) -> str:
    """A PEM signing request for ``key`` (its subject is only informative: the API names the Pod IP)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node[:64])])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path``, mode 0600 from the start, replacing it in one rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class ServingCertificate:
    """The serving certificate and key files the API issues, kept current."""

    def __init__(self, directory: str, node: str, api_url: str, api_ca_file: str, auth_headers: Callable):
        self.directory = Path(directory)
        self.cert_file, self.key_file = str(self.directory / "serving.crt"), str(self.directory / "serving.key")
        self.node, self.api_url, self.api_ca_file = node, api_url.rstrip("/"), api_ca_file
        self.auth_headers = auth_headers
        self.renew_time = 0.0  # time.time() when to ask again
        self.listeners: list[Callable[[], None]] = []  # called after a new certificate is in place

    def request(self) -> None:
        """Ask once: a new key, its certificate, both files written. Raises on any failure."""
        key = ec.generate_private_key(ec.SECP256R1())
        session = requests.Session()
        session.trust_env = False
        resp = session.post(
            f"{self.api_url}{PATH}",
            json={"csr": signing_request(key, self.node)},
            headers=self.auth_headers(),
            verify=self.api_ca_file,
            timeout=30,
        )
        if resp.status_code != 200:
            raise CertificateRefused(f"the API answered {resp.status_code}: {_message(resp)}")
        cert = x509.load_pem_x509_certificate(resp.json()["certificate"].encode())
        if _spki(cert.public_key()) != _spki(key.public_key()):
            raise CertificateRefused("the API's certificate is not for the key sent")
        self._install(key, cert)

    def _install(self, key, cert: x509.Certificate) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        write_private(Path(self.key_file), pem)  # the servers load the pair after both are written
        write_private(Path(self.cert_file), cert.public_bytes(serialization.Encoding.PEM))
        now = datetime.datetime.now(datetime.UTC)
        start = max(now, cert.not_valid_before_utc)
        self.renew_time = start.timestamp() + RENEW_AT * max(0.0, (cert.not_valid_after_utc - start).total_seconds())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        log.info(
            "serving certificate %x from the API for %s, until %s; renewing at %s",
            cert.serial_number,
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
                    log.exception("loading the renewed serving certificate")


def _message(resp) -> str:
    try:
        return str(resp.json().get("message") or resp.text[:200])
    except ValueError:
        return resp.text[:200]


def _spki(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
