"""Client certificates of the plugin CA: the ones the plugins present to each other and the API's own.

No bearer token is ever sent to a node (a token a node received could be replayed to every other node).
Whoever calls a plugin presents a short-lived client certificate of the plugin CA instead, its subject
naming the caller: ``system:gpustack-models-plugin:<node>`` for a node's plugin (issued with its serving
certificate, ``internal.signing``), ``system:gpustack-models-service`` for the API reading live bytes
(``GET /model/downloads``). Each may authenticate a TLS client (``clientAuth``) and nothing else: never
serve TLS, never sign. A plugin checks the chain against the plugin CA, the usage and the name.

``ServiceClient`` is the API's own: it signs it in-process with the plugin CA key the API already holds
(``GPUSTACK_PLUGIN_CA_KEY_FILE``), valid ``SERVICE_SECONDS`` and made again at two thirds of that, a new
key each time. Python's ``ssl`` loads a certificate from files only, so key and certificate are written
(mode 0600) into a directory of this process's own (mode 0700, under the temporary directory, which the
API's Pods keep in memory), and ``context()`` answers a TLS context holding them, a new one after each
renewal (callers that keep connections rebuild them when it changes). No Django here: the plugin CA's
files are the caller's settings.
"""

from __future__ import annotations

import datetime
import logging
import shutil
import ssl
import tempfile
import threading
import time
import warnings
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpustack_models.file_stamps import file_stamps
from gpustack_models.private_files import write_private

log = logging.getLogger(__name__)

PLUGIN_PREFIX = "system:gpustack-models-plugin:"  # + the node's name
SERVICE_NAME = "system:gpustack-models-service"
SERVICE_SECONDS = 3600  # the API's own client certificate: an hour
RENEW_AT = 2 / 3  # of its validity
BACKDATE = datetime.timedelta(minutes=1)  # a node's clock a little behind still accepts a new certificate


def common_name(value: str) -> x509.Name:
    """A subject of the one ``CN`` ``value``, whole: a node's name may be longer than the 64 characters
    X.509 suggests, and a name cut short could be another node's (as Kubernetes' ``system:node:<name>``)."""
    with warnings.catch_warnings():  # ``_validate=False``: beyond 64 characters, a warning instead of an error
        warnings.simplefilter("ignore", UserWarning)
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, value, _validate=False)])


def key_usage(encipherment: bool) -> x509.KeyUsage:
    """The key usage of a leaf certificate of the plugin CA: signatures, and key encipherment only when
    asked (an RSA serving key, for clients exchanging keys the old way); never certificate signing."""
    return x509.KeyUsage(
        digital_signature=True,
        key_encipherment=encipherment,
        content_commitment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def client_certificate(ca_cert, ca_key, public_key, name: str, seconds: int, now=None) -> x509.Certificate:
    """A certificate of the CA (``ca_cert``, ``ca_key``) for ``public_key``, subject CN ``name``, for
    ``seconds`` (not past the CA's own end): TLS client authentication only, not a CA."""
    now = now or datetime.datetime.now(datetime.UTC)
    end = min(now + datetime.timedelta(seconds=seconds), ca_cert.not_valid_after_utc)
    usage = key_usage(encipherment=False)
    builder = (
        x509.CertificateBuilder()
        .subject_name(common_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(now - BACKDATE, ca_cert.not_valid_before_utc))
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    algorithm = None if isinstance(ca_key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey) else hashes.SHA256()
    return builder.sign(ca_key, algorithm)


def spki(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def matching_certificate(certs: list[x509.Certificate], key) -> x509.Certificate | None:
    """The certificate of ``certs`` (a CA bundle, several during a rotation) whose public key is ``key``'s."""
    own = spki(key.public_key())
    return next((cert for cert in certs if spki(cert.public_key()) == own), None)


class ServiceClient:
    """The API's client certificate for the plugins, made from the plugin CA's files and kept current."""

    def __init__(self, seconds: int = SERVICE_SECONDS):
        self.seconds = seconds
        self._lock = threading.Lock()
        self._directory: Path | None = None
        self._context: ssl.SSLContext | None = None
        self._renew_at = 0.0  # time.monotonic() when to make a new one
        self._files: tuple | None = None  # the plugin CA files' stamps at the last renewal: a rotated CA renews
        self.serial = 0  # of the certificate in use

    def context(self, ca_file: str, key_file: str) -> ssl.SSLContext:
        """A TLS client context trusting the plugin CA (``ca_file``) and presenting the current certificate,
        signed with the CA's key (``key_file``); the same object until the certificate is renewed (at two
        thirds of its validity, or when either file changes: a rotated plugin CA). Raises
        ``OSError``/``ValueError``/``ssl.SSLError`` when the plugin CA (its certificate or key) cannot be loaded."""
        files = file_stamps(ca_file, key_file)
        with self._lock:
            due = self._context is None or time.monotonic() >= self._renew_at
            if due or files != self._files:
                try:
                    self._context = self._renew(ca_file, key_file)
                except (OSError, ValueError, ssl.SSLError) as exc:
                    if due:
                        raise
                    log.error("the plugin CA files changed but do not load (%s); keeping the current context", exc)
                self._files = files
            return self._context

    def _renew(self, ca_file: str, key_file: str) -> ssl.SSLContext:
        if not key_file:
            raise ValueError("this API holds no plugin CA key (GPUSTACK_PLUGIN_CA_KEY_FILE)")
        ca_key = serialization.load_pem_private_key(Path(key_file).read_bytes(), password=None)
        ca_cert = matching_certificate(x509.load_pem_x509_certificates(Path(ca_file).read_bytes()), ca_key)
        if ca_cert is None:
            raise ValueError("the plugin CA key belongs to no certificate of GPUSTACK_PLUGIN_CA_FILE")
        key = ec.generate_private_key(ec.SECP256R1())
        cert = client_certificate(ca_cert, ca_key, key.public_key(), SERVICE_NAME, self.seconds)
        cert_file, key_file = self._write(key, cert)
        context = ssl.create_default_context(cafile=ca_file)  # the plugins' serving certificates: never unverified
        context.load_cert_chain(cert_file, key_file)
        lifetime = (cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)).total_seconds()
        self._renew_at = time.monotonic() + RENEW_AT * max(0.0, lifetime)
        self.serial = cert.serial_number
        log.info(
            "client certificate %x for reading the plugins, until %s", cert.serial_number, cert.not_valid_after_utc
        )
        return context

    def _write(self, key, cert: x509.Certificate) -> tuple[str, str]:
        if self._directory is None or not self._directory.is_dir():
            self._directory = Path(tempfile.mkdtemp(prefix="gpustack-models-service-client-"))  # mode 0700
        cert_file, key_file = self._directory / "client.crt", self._directory / "client.key"
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        write_private(key_file, pem)
        write_private(cert_file, cert.public_bytes(serialization.Encoding.PEM))
        return str(cert_file), str(key_file)

    def close(self) -> None:
        """Remove the directory and its key (tests; a process that ends takes its memory-backed /tmp along)."""
        with self._lock:
            if self._directory is not None:
                shutil.rmtree(self._directory, ignore_errors=True)
            self._directory, self._context = None, None


service_client = ServiceClient()
