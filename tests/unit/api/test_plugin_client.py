"""The API's own client certificate for the plugins: what it names and may do, where its key is kept, and
that a new one (a new TLS context) is made at two thirds of its validity."""

import os
import ssl
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpustack_models.api import plugin_client
from gpustack_models.api.plugin_client import SERVICE_NAME, ServiceClient
from gpustack_models.local import pki


@pytest.fixture
def ca(tmp_path):
    return pki.new_ca("plugin-ca").write(tmp_path, "ca")


def written(client: ServiceClient) -> tuple[x509.Certificate, os.stat_result, os.stat_result]:
    directory = client._directory
    cert = x509.load_pem_x509_certificate((directory / "client.crt").read_bytes())
    return cert, os.stat(directory), os.stat(directory / "client.key")


def test_it_names_the_service_and_only_authenticates_a_client(ca):
    client = ServiceClient(seconds=3600)
    try:
        context = client.context(str(ca[0]), str(ca[1]))
        assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED
        cert, directory, key = written(client)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == SERVICE_NAME
        assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
            ExtendedKeyUsageOID.CLIENT_AUTH
        ]
        assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca[0].read_bytes()))
        assert (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds() <= 3600 + 60
        assert stat.S_IMODE(directory.st_mode) == 0o700 and stat.S_IMODE(key.st_mode) == 0o600
        assert directory.st_uid == os.getuid()
        assert serialization.load_pem_private_key((client._directory / "client.key").read_bytes(), None)
        assert client.context(str(ca[0]), str(ca[1])) is context  # the same until it is renewed
    finally:
        client.close()


def test_it_makes_a_new_certificate_and_context_at_two_thirds(ca, monkeypatch):
    client = ServiceClient(seconds=3600)
    now = [1000.0]
    monkeypatch.setattr(plugin_client.time, "monotonic", lambda: now[0])
    try:
        first = client.context(str(ca[0]), str(ca[1]))
        serial = client.serial
        now[0] += 3600 * 2 / 3 - 120  # before two thirds (less the backdating): the same
        assert client.context(str(ca[0]), str(ca[1])) is first and client.serial == serial
        now[0] += 121
        second = client.context(str(ca[0]), str(ca[1]))
        assert second is not first and client.serial != serial
        assert written(client)[0].serial_number == client.serial
    finally:
        client.close()
    assert client._directory is None


def test_it_refuses_without_the_ca_key_or_with_another_cas(ca, tmp_path):
    other_key = pki.new_ca("other").write(tmp_path / "other", "ca")[1]
    for key_file, error in [("", ValueError), (str(tmp_path / "missing.key"), OSError), (str(other_key), ValueError)]:
        with pytest.raises(error):
            ServiceClient().context(str(ca[0]), key_file)


def test_a_rotated_plugin_ca_makes_a_new_context_and_a_broken_one_keeps_the_current(ca, tmp_path):
    client = ServiceClient(seconds=3600)
    try:
        first = client.context(str(ca[0]), str(ca[1]))
        rotated = pki.new_ca("plugin-ca-2")
        rotated.write(tmp_path / "next", "ca")
        os.replace(tmp_path / "next" / "ca.key", ca[1])  # the key first, as a Secret's files land one by one
        assert client.context(str(ca[0]), str(ca[1])) is first  # no certificate for that key yet: kept
        os.replace(tmp_path / "next" / "ca.crt", ca[0])
        second = client.context(str(ca[0]), str(ca[1]))
        assert second is not first
        written(client)[0].verify_directly_issued_by(rotated.cert)
    finally:
        client.close()
