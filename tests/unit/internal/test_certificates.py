"""The checks of a plugin's certificate request that need no cluster: whose Pod a token is bound to, what the
Pod read back must be (given as kube-apiserver answers it), the CA loaded again when its files change, and
the bound on the body. The endpoint through kube-apiserver: tests/test_plugin_certificates.py."""

import io
import os

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpustack_models import kube
from gpustack_models.api.authentication import make_user
from gpustack_models.internal.certificates import (
    MAX_BODY_BYTES,
    POD_NAME_EXTRA,
    POD_UID_EXTRA,
    SigningRequestParser,
    _AuthorityCache,
    bound_pod,
    read_pod,
    requests_of,
)
from gpustack_models.internal.signing import SigningRequestError
from gpustack_models.kube.errors import Forbidden, NotFound, RequestEntityTooLarge, ServiceUnavailable
from gpustack_models.kube.identity import NODE_NAME_EXTRA
from gpustack_models.local import pki

UID = "6f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f"
BOUND = {NODE_NAME_EXTRA: ["node-a"], POD_NAME_EXTRA: ["plugin-x7k2p"], POD_UID_EXTRA: [UID]}


def plugin(**extra):
    return make_user("system:serviceaccount:gpustack-system:gpustack-models-plugin", extra=BOUND | extra)


def test_a_pod_bound_token_names_its_node_pod_and_uid():
    assert bound_pod(plugin()) == ("node-a", "plugin-x7k2p", UID)


@pytest.mark.parametrize(
    "extra",
    [
        {NODE_NAME_EXTRA: []},
        {POD_NAME_EXTRA: [""]},
        {POD_UID_EXTRA: [UID, UID]},
    ],
)
def test_a_token_bound_to_no_single_pod_is_forbidden(extra):
    with pytest.raises(Forbidden, match="this token is not bound to a Pod"):
        bound_pod(plugin(**extra))
    with pytest.raises(Forbidden):
        bound_pod(make_user("system:serviceaccount:gpustack-system:gpustack-models-plugin"))


class Cluster:
    """kube-apiserver's answer to a read of one Pod."""

    def __init__(self, pod):
        self.pod, self.paths = pod, []

    def get(self, path):
        self.paths.append(path)
        if self.pod is None:
            raise kube.NotFound("pods not found")
        return self.pod


def pod(uid=UID, node="node-a", account="gpustack-models-plugin"):
    spec = {"nodeName": node, "containers": [{"name": "plugin"}]}
    if account is not None:
        spec["serviceAccountName"] = account
    return {"metadata": {"name": "plugin-x7k2p", "uid": uid}, "spec": spec, "status": {"phase": "Running"}}


@pytest.fixture
def cluster(monkeypatch, settings):
    settings.NAMESPACE, settings.PLUGIN_SERVICE_ACCOUNT = "gpustack-system", "gpustack-models-plugin"

    def answering(found):
        stand_in = Cluster(found)
        monkeypatch.setattr(kube, "default", lambda: stand_in)
        return stand_in

    return answering


def test_the_pod_is_read_live_in_the_services_namespace(cluster):
    answer = cluster(pod())
    assert read_pod("node-a", "plugin-x7k2p", UID) is answer.pod
    assert answer.paths == ["/api/v1/namespaces/gpustack-system/pods/plugin-x7k2p"]


@pytest.mark.parametrize(
    "found, error, message",
    [
        (None, NotFound, "pod gpustack-system/plugin-x7k2p, which the token is bound to, does not exist"),
        (pod(uid="another"), NotFound, f"pod gpustack-system/plugin-x7k2p of uid {UID}, which the token"),
        (pod(node="node-b"), Forbidden, "pod gpustack-system/plugin-x7k2p is not on node node-a"),
        (pod(account="default"), Forbidden, "does not run as the plugins' ServiceAccount"),
        (pod(account=None), Forbidden, "does not run as the plugins' ServiceAccount"),  # "default"
    ],
)
def test_a_pod_that_is_not_the_tokens_plugin_on_its_node_gets_nothing(cluster, found, error, message):
    cluster(found)
    with pytest.raises(error) as raised:
        read_pod("node-a", "plugin-x7k2p", UID)
    assert type(raised.value) is error and message in raised.value.message


@pytest.fixture
def ca_files(tmp_path, settings):
    crt, key = pki.new_ca("plugin-ca").write(tmp_path, "ca")
    settings.PLUGIN_CA_FILE, settings.PLUGIN_CA_KEY_FILE = str(crt), str(key)
    return crt, key


def test_the_ca_is_loaded_once_and_again_when_its_files_change(ca_files, tmp_path):
    cache = _AuthorityCache()
    first = cache.get()
    assert cache.get() is first and first.bundle_pem == ca_files[0].read_bytes()
    for new in pki.new_ca("plugin-ca-2").write(tmp_path / "rotated", "ca"):  # as the kubelet swaps a Secret's files
        os.replace(new, tmp_path / new.name)
    second = cache.get()
    assert second is not first and second.cert.subject != first.cert.subject
    assert cache.get() is second


def test_a_ca_key_missing_is_503_until_it_is_there(ca_files):
    crt, key = ca_files
    held = key.read_bytes()
    key.unlink()
    cache = _AuthorityCache()
    with pytest.raises(ServiceUnavailable, match="GPUSTACK_PLUGIN_CA_KEY_FILE"):
        cache.get()
    key.write_bytes(held)
    assert cache.get().cert.subject.rfc4514_string().endswith("plugin-ca")


def test_the_body_is_bounded_at_16_kib():
    assert MAX_BODY_BYTES == 16 * 1024
    fits = b'{"csr": "' + b"A" * (MAX_BODY_BYTES - 11) + b'"}'
    assert len(fits) == MAX_BODY_BYTES and SigningRequestParser().parse(io.BytesIO(fits))["csr"]
    with pytest.raises(RequestEntityTooLarge):
        SigningRequestParser().parse(io.BytesIO(fits[:-2] + b'A"}'))


def csr_pem(key) -> str:
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node-a")])
    )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def test_the_body_holds_two_requests_for_two_keys_or_the_serving_one_alone():
    serving, client = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    csr, client_csr = requests_of({"csr": csr_pem(serving), "clientCsr": csr_pem(client)})
    assert csr.public_key().public_numbers() == serving.public_key().public_numbers()
    assert client_csr.public_key().public_numbers() == client.public_key().public_numbers()
    assert requests_of({"csr": csr_pem(serving)})[1] is None  # a plugin of an earlier version
    for body, why in [
        ({"csr": csr_pem(serving), "clientCsr": csr_pem(serving)}, "clientCsr: the client certificate needs a key"),
        ({"csr": csr_pem(serving), "clientCsr": "hello"}, "clientCsr must hold exactly one PEM block"),
        ({"clientCsr": csr_pem(client)}, '"csr"'),
        (["not", "an", "object"], "expected a JSON body"),
    ]:
        with pytest.raises(SigningRequestError, match=why):
            requests_of(body)
