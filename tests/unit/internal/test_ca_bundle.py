"""What the CA ConfigMap takes from a file: certificates only, re-encoded; never a file with a key in it.
Publishing through kube-apiserver: tests/test_plugin_certificates.py."""

import pytest
from cryptography import x509

from gpustack_models.internal.ca_bundle import NotCertificates, certificates_of, configmap
from gpustack_models.local import pki


def test_it_takes_the_certificates_of_a_bundle_and_nothing_else(tmp_path):
    first, second = pki.new_ca("one"), pki.new_ca("two")
    bundle = tmp_path / "bundle.crt"
    bundle.write_bytes(b"# a comment that does not travel\n" + first.cert_pem + b"\n" + second.cert_pem)
    text = certificates_of(str(bundle))
    assert x509.load_pem_x509_certificates(text.encode()) == [first.cert, second.cert]
    assert "comment" not in text
    data = configmap("gpustack-models-ca", "ns", text, text)["data"]
    assert sorted(data) == ["api-ca.crt", "plugin-ca.crt"]


@pytest.mark.parametrize(
    "content, why",
    [
        (lambda ca: ca.cert_pem + ca.key_pem, "holds a private key"),  # a cert-manager tls.crt + tls.key mix-up
        (lambda ca: ca.key_pem, "holds a private key"),
        (lambda ca: b"-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n", "holds a private key"),
        (lambda ca: b"not a certificate", "does not hold PEM certificates"),
        (lambda ca: b"", "does not hold PEM certificates"),
    ],
)
def test_it_refuses_a_file_with_a_key_or_without_certificates(tmp_path, content, why):
    path = tmp_path / "ca.crt"
    path.write_bytes(content(pki.new_ca("ca")))
    with pytest.raises(NotCertificates, match=why):
        certificates_of(str(path))
