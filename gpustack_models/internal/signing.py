"""Signing the node plugins' serving certificates: the pure parts (no Django, no Kubernetes).

A plugin sends a certificate signing request (PKCS #10, PEM); the API takes from it only the public
key, after checking the request's own signature (the plugin holds the private key) and the key's kind:
RSA of 2048 to 4096 bits, or EC on P-256. Nothing else of the request is taken over: not its subject,
not its extensions, not the names it asks for. The certificate names the Pod's IPs only (``IP:`` SANs,
as the Pod read from the cluster has them), its subject is ``system:gpustack-models-plugin:<node>``, and
it may serve TLS (``serverAuth``) and nothing else, never a CA. With it comes the plugin's client
certificate (``Authority.issue_client``, for a second key of a second request): the same subject, no
names, TLS client authentication (``clientAuth``) and nothing else, never a CA; the plugin presents it to
its peers, who take the node from its subject (``api.plugin_client``). Neither certificate can stand in
for the other.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpustack_models.api.plugin_client import PLUGIN_PREFIX, client_certificate, key_usage, matching_certificate
from gpustack_models.kube.errors import BadRequest, Conflict, ServiceUnavailable

RSA_BITS = (2048, 4096)  # the sizes of RSA keys signed, inclusive
SUBJECT_PREFIX = PLUGIN_PREFIX
BACKDATE = datetime.timedelta(minutes=1)  # a node's clock a little behind still accepts a new certificate
PEM_MARKERS = (b"-----BEGIN CERTIFICATE REQUEST-----", b"-----BEGIN NEW CERTIFICATE REQUEST-----")


class SigningRequestError(BadRequest):
    """A request that cannot be signed (400, the reason in the message)."""


def load_request(pem, field: str = "csr") -> x509.CertificateSigningRequest:
    """The signing request in ``pem`` (one PEM block) of the body's ``field``, its signature checked; 400
    naming ``field`` otherwise."""
    if not isinstance(pem, str) or not pem.strip():
        raise SigningRequestError(f'expected a JSON body {{"{field}": "<PEM certificate signing request>"}}')
    raw = pem.encode("ascii", errors="replace")
    if raw.count(b"-----BEGIN ") != 1 or not raw.lstrip().startswith(PEM_MARKERS):
        raise SigningRequestError(f"{field} must hold exactly one PEM block: -----BEGIN CERTIFICATE REQUEST-----")
    try:
        csr = x509.load_pem_x509_csr(raw)
    except ValueError as exc:
        raise SigningRequestError(f"{field} is not a PEM certificate signing request: {exc}") from None
    check_key(csr.public_key(), field)
    if not csr.is_signature_valid:
        raise SigningRequestError(f"the signature of the certificate signing request {field} does not verify")
    return csr


def check_key(key, field: str = "csr") -> None:
    """RSA of ``RSA_BITS`` or EC on P-256; 400 naming ``field`` for anything else."""
    if isinstance(key, rsa.RSAPublicKey):
        if not RSA_BITS[0] <= key.key_size <= RSA_BITS[1]:
            raise SigningRequestError(
                f"{field}: an RSA key of {key.key_size} bits: only {RSA_BITS[0]} to {RSA_BITS[1]} bits, or EC P-256"
            )
        return
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise SigningRequestError(f"{field}: an EC key on {key.curve.name}: only P-256 (secp256r1), or RSA")
        return
    kind = type(key).__name__.removeprefix("_")
    raise SigningRequestError(f"{field}: a {kind} key: only EC P-256 or RSA of 2048-4096 bits")


def pod_addresses(pod: dict) -> list[str]:
    """The IPs of a Running Pod (``status.podIP`` first, then ``status.podIPs``), each once; 409 while it
    has none or is not Running."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    named = f"pod {(pod.get('metadata') or {}).get('name')}"
    if phase != "Running":
        raise Conflict(f"{named} is {phase or 'not Running'} yet: no certificate before it runs with an IP")
    listed = [status.get("podIP")] + [(p or {}).get("ip") for p in status.get("podIPs") or [] if isinstance(p, dict)]
    addresses: list[str] = []
    for value in listed:
        if isinstance(value, str) and value:
            try:
                text = str(ipaddress.ip_address(value))
            except ValueError:
                continue
            if text not in addresses:
                addresses.append(text)
    if not addresses:
        raise Conflict(f"{named} has no IP yet (status.podIP): ask again once it has one")
    return addresses


@dataclass(frozen=True)
class Authority:
    """The plugin CA: its certificate and private key."""

    cert: x509.Certificate
    key: object
    bundle_pem: bytes  # the CA file as read (what the plugins' callers trust)

    def issue(self, public_key, node: str, addresses: list[str], seconds: int, now=None) -> x509.Certificate:
        """A serving certificate for ``public_key`` naming ``addresses`` only, for ``seconds`` (not past
        the CA's own end)."""
        now = now or datetime.datetime.now(datetime.UTC)
        end = min(now + datetime.timedelta(seconds=seconds), self.cert.not_valid_after_utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{SUBJECT_PREFIX}{node}"[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(max(now - BACKDATE, self.cert.not_valid_before_utc))
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(key_usage(isinstance(public_key, rsa.RSAPublicKey)), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(subject_alternative_names(addresses), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        algorithm = None if isinstance(self.key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey) else hashes.SHA256()
        return builder.sign(self.key, algorithm)

    def issue_client(self, public_key, node: str, seconds: int, now=None) -> x509.Certificate:
        """The client certificate of ``node``'s plugin for ``public_key``: subject CN
        ``system:gpustack-models-plugin:<node>`` (whole, however long), ``clientAuth`` only, for ``seconds``."""
        return client_certificate(self.cert, self.key, public_key, f"{SUBJECT_PREFIX}{node}", seconds, now)


def subject_alternative_names(addresses: list[str]) -> x509.SubjectAlternativeName:
    """``IP:`` names of ``addresses``, nothing else."""
    return x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(a)) for a in addresses])


def load_authority(cert_file: str, key_file: str) -> Authority:
    """The plugin CA from its files: the certificate of the CA file (a bundle during a rotation) whose
    public key is the key's. 503 when this process has no usable key: it cannot sign."""
    why = "set GPUSTACK_PLUGIN_CA_KEY_FILE on the API's Pods to the plugin CA's private key"
    if not key_file:
        raise ServiceUnavailable(f"this API holds no plugin CA key, so it issues no plugin certificates: {why}")
    try:
        key = serialization.load_pem_private_key(Path(key_file).read_bytes(), password=None)
        bundle = Path(cert_file).read_bytes()
        certs = x509.load_pem_x509_certificates(bundle)
    except (OSError, ValueError, TypeError) as exc:
        raise ServiceUnavailable(f"this API cannot load the plugin CA ({type(exc).__name__}): {why}") from None
    cert = matching_certificate(certs, key)
    if cert is None:
        raise ServiceUnavailable("the plugin CA key does not belong to any certificate of GPUSTACK_PLUGIN_CA_FILE")
    return Authority(cert, key, bundle)
