"""The peers' contract: the ranges a peer has, the peer URLs, and the client certificate a plugin shows its
peers (loaded again when it is renewed)."""

import os
import ssl

import pytest

from gpustack_models.local import pki
from gpustack_models.plugin.peers.contract import (
    ClientCertificate,
    ClientCertificateUnavailable,
    covers,
    file_url,
    tree_url,
)


def test_it_says_whether_a_peer_has_a_range():
    have = [[0, 100], [200, 300]]
    assert covers(have, 0, 100) and covers(have, 250, 300) and covers(have, 50, 50)
    assert not covers(have, 90, 210) and not covers(have, 100, 101) and not covers([], 0, 1)


def test_it_builds_the_peer_urls():
    digest = "sha256:" + "ab" * 32
    assert tree_url("https://10.0.0.1:8444/", digest) == f"https://10.0.0.1:8444/peer/v1/trees/{'ab' * 32}"
    assert file_url("https://10.0.0.1:8444", digest, "a b/c#d.bin").endswith(f"{'ab' * 32}/files/a%20b/c%23d.bin")
    with pytest.raises(ValueError):
        tree_url("https://10.0.0.1:8444", "sha256:../x")


def test_it_loads_the_client_certificate_again_when_it_is_renewed(tmp_path):
    ca = pki.new_ca("plugin-ca")
    ca_file, _ = ca.write(tmp_path, "ca")
    cert_file, key_file = tmp_path / "client.crt", tmp_path / "client.key"
    tls = ClientCertificate(cert_file, key_file, str(ca_file))
    with pytest.raises(ClientCertificateUnavailable):
        tls()
    first = pki.issue(ca, "system:gpustack-models-plugin:node-a", client=True)
    first.write(tmp_path, "client")
    context = tls()
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED
    assert tls() is context  # the same until the files change
    second = pki.issue(ca, "system:gpustack-models-plugin:node-a", client=True)
    key_file.write_bytes(second.key_pem)  # renewed: the key first ...
    assert tls() is context  # ... a pair that does not match keeps the previous one
    cert_file.write_bytes(second.cert_pem)
    renewed = tls()
    assert renewed is not context
    os.remove(cert_file)
    with pytest.raises(ClientCertificateUnavailable):
        tls()


def test_it_trusts_a_rotated_peer_ca_file_on_its_next_context(tmp_path):
    ca, rotated = pki.new_ca("plugin-ca"), pki.new_ca("plugin-ca-2")
    ca_file, _ = ca.write(tmp_path, "ca")
    pki.issue(ca, "system:gpustack-models-plugin:node-a", client=True).write(tmp_path, "client")
    tls = ClientCertificate(tmp_path / "client.crt", tmp_path / "client.key", str(ca_file))
    context = tls()
    assert len(context.get_ca_certs()) == 1
    ca_file.write_bytes(ca.cert_pem + rotated.cert_pem)  # the CA ConfigMap's bundle, the next CA added
    assert tls() is not context and len(tls().get_ca_certs()) == 2
