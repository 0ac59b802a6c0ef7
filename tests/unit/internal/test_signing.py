"""The pure parts of the plugins' certificates: which signing requests are taken, what the certificate names."""

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpustack_models.internal.signing import (
    SUBJECT_PREFIX,
    SigningRequestError,
    load_authority,
    load_request,
    pod_addresses,
)
from gpustack_models.kube.errors import Conflict, ServiceUnavailable
from gpustack_models.local import pki

SHA256 = hashes.SHA256()


def request_pem(key, cn="node-a", dns=(), ips=(), algorithm=SHA256) -> str:
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    )
    names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return builder.sign(key, algorithm).public_bytes(serialization.Encoding.PEM).decode()


def tampered(pem: str) -> str:
    """The same request with its subject changed after signing (so the signature no longer verifies)."""
    der = bytearray(x509.load_pem_x509_csr(pem.encode()).public_bytes(serialization.Encoding.DER))
    at = der.index(b"node-a")
    der[at : at + 6] = b"node-b"
    return x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture(scope="module")
def authority(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ca")
    crt, key = pki.new_ca("plugin-ca").write(directory, "ca")
    return load_authority(str(crt), str(key))


def test_it_takes_ec_p256_and_rsa_2048_to_4096():
    for key in (ec.generate_private_key(ec.SECP256R1()), rsa.generate_private_key(65537, 2048)):
        assert load_request(request_pem(key)).public_key().public_numbers() == key.public_key().public_numbers()


@pytest.mark.parametrize(
    "key, why",
    [
        (lambda: rsa.generate_private_key(65537, 1024), "RSA key of 1024 bits"),
        (lambda: dsa.generate_private_key(2048), "DSAPublicKey key"),
        (lambda: ec.generate_private_key(ec.SECP384R1()), "EC key on secp384r1"),
        (ed25519.Ed25519PrivateKey.generate, "Ed25519PublicKey key"),
    ],
)
def test_it_refuses_other_keys(key, why):
    k = key()
    pem = request_pem(k, algorithm=None if isinstance(k, ed25519.Ed25519PrivateKey) else hashes.SHA256())
    with pytest.raises(SigningRequestError, match=why):
        load_request(pem)


def test_it_refuses_garbage_and_a_signature_that_does_not_verify():
    key = ec.generate_private_key(ec.SECP256R1())
    good = request_pem(key)
    for bad, why in [
        (None, "expected a JSON body"),
        ("", "expected a JSON body"),
        ("hello", "exactly one PEM block"),
        ("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", "not a PEM certificate"),
        (good + good, "exactly one PEM block"),
        (pki.new_ca("x").cert_pem.decode(), "exactly one PEM block"),
        (tampered(good), "does not verify"),
    ]:
        with pytest.raises(SigningRequestError, match=why):
            load_request(bad)


def test_it_names_the_pods_ips_only_whatever_the_request_asks(authority):
    key = ec.generate_private_key(ec.SECP256R1())
    csr = load_request(request_pem(key, cn="system:masters", dns=("evil.example", "kubernetes"), ips=("10.0.0.99",)))
    pod = {"metadata": {"name": "p"}, "status": {"phase": "Running", "podIP": "10.1.2.3",
           "podIPs": [{"ip": "10.1.2.3"}, {"ip": "fd00::3"}, {"ip": "not-an-ip"}]}}  # fmt: skip
    cert = authority.issue(csr.public_key(), "node-a", pod_addresses(pod), 3600)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(names) == [
        x509.IPAddress(ipaddress.ip_address("10.1.2.3")),
        x509.IPAddress(ipaddress.ip_address("fd00::3")),
    ]
    assert cert.subject.rfc4514_string() == f"CN={SUBJECT_PREFIX}node-a"
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    cert.verify_directly_issued_by(authority.cert)
    lifetime = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(minutes=59) < lifetime <= datetime.timedelta(hours=1)


def test_it_issues_nothing_before_the_pod_runs_with_an_ip():
    for status in ({"phase": "Pending"}, {"phase": "Running"}, {"phase": "Running", "podIP": "nope"}):
        with pytest.raises(Conflict):
            pod_addresses({"metadata": {"name": "p"}, "status": status})


def test_it_answers_503_without_a_usable_ca_key(tmp_path, authority):
    crt, key = pki.new_ca("plugin-ca").write(tmp_path, "ca")
    other_crt, _ = pki.new_ca("other").write(tmp_path / "other", "ca")
    for cert_file, key_file, why in [
        (crt, "", "holds no plugin CA key"),
        (crt, tmp_path / "missing.key", "cannot load the plugin CA"),
        (crt, crt, "cannot load the plugin CA"),  # not a key
        (other_crt, key, "does not belong"),
    ]:
        with pytest.raises(ServiceUnavailable, match=why):
            load_authority(str(cert_file), str(key_file))
    bundle = tmp_path / "bundle.crt"  # a CA file holding two CAs (a rotation): the key's own is used
    bundle.write_bytes(other_crt.read_bytes() + crt.read_bytes())
    assert (
        load_authority(str(bundle), str(key)).cert.subject == x509.load_pem_x509_certificate(crt.read_bytes()).subject
    )


@pytest.mark.filterwarnings("ignore:Attribute's length:UserWarning")  # cryptography, reading a long CN back
def test_the_client_certificate_names_the_node_whole_and_only_authenticates_a_client(authority):
    key = ec.generate_private_key(ec.SECP256R1())
    node = "a-node-whose-name-is-far-longer-than-the-64-characters-x509-suggests.example.internal"
    cert = authority.issue_client(key.public_key(), node, 3600)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"{SUBJECT_PREFIX}{node}"
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign and not usage.crl_sign
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    cert.verify_directly_issued_by(authority.cert)
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    lifetime = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(minutes=59) < lifetime <= datetime.timedelta(hours=1)


def test_a_refused_request_names_its_field():
    with pytest.raises(SigningRequestError, match="clientCsr must hold exactly one PEM block"):
        load_request("hello", "clientCsr")
    with pytest.raises(SigningRequestError, match="clientCsr: an EC key on secp384r1"):
        load_request(request_pem(ec.generate_private_key(ec.SECP384R1())), "clientCsr")
