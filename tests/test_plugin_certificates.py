"""The plugins' certificates, issued by the worker (``POST /internal/v1/plugin-certificates``): a real plugin
gets a serving one for its Pod IP, serves it on both ports and renews it, with the client certificate it
presents to its peers (its node's name, clientAuth only); the endpoint refuses every caller but a plugin's
Pod-bound token, and names only that Pod's IPs and node."""

import ipaddress
import json
import socket
import ssl
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support import PEER_PORT, PLUGIN_PORT, REPO, TEST_STATE, wait_for
from tests.support.plugins import PluginProcess
from tests.support.worker import WorkerAPI, database_url
from tests.test_plugins import big_files

PATH = "/internal/v1/plugin-certificates"
FROM_API = {"GPUSTACK_PLUGIN_CERT_FROM_API": "true"}  # as the launcher starts every plugin, as in the chart


class ExtraAPI(WorkerAPI):
    """Another API process of the same worker with its own settings (not registered with kube-apiserver)."""

    def __init__(self, launcher, port, db_url, **env):
        super().__init__(launcher, port, db_url)
        self.extra = env

    def env(self) -> dict:
        return {**super().env(), **self.extra}


@pytest.fixture
def extra_api(launcher, worker_api, django_db_blocker):
    """``extra_api(port, **env)`` starts another API process; all stopped after the test."""
    from gpustack_models.local.cluster import free_port

    with django_db_blocker.unblock():
        url = database_url()
    started = []

    def start(port=None, **env):
        api = ExtraAPI(launcher, port or free_port(), url, **env)
        started.append(api)
        api.start()
        return api

    yield start
    for api in started:
        api.stop()


def plugin_ca(launcher) -> Path:
    return launcher.data_dir / "plugin-pki" / "ca.crt"


def served(address: str, port: int, ca: Path) -> x509.Certificate:
    """The certificate served at ``address:port``, verified against ``ca`` for the IP ``address``."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection((address, port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname=address) as tls,
    ):
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def usages(cert: x509.Certificate) -> list:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def ip_names(cert: x509.Certificate) -> list:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return list(names)


def csr(key, cn="node", dns=(), ips=(), algorithm=None) -> str:
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    )
    names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(key, algorithm or hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def ask(worker_api, token=None, body=None, **kwargs):
    s = requests.Session()
    s.trust_env = False
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return s.post(
        f"{worker_api.url}{PATH}", json=body, headers=headers, verify=str(worker_api.ca_file), timeout=30, **kwargs
    )


def refused(resp, code: int, words: str = "") -> None:
    assert resp.status_code == code, resp.text
    body = resp.json()
    assert body["kind"] == "Status" and body["code"] == code and words in body["message"], body


def test_a_plugin_without_certificate_files_serves_the_one_the_worker_issued_for_its_pod_ip(scenario, launcher):
    scenario.artifact(files=big_files(scenario.repo, mb=6))
    (plugin,) = scenario.plugins(1, **FROM_API)
    ca = plugin_ca(launcher)
    main, peer = served(plugin.address, PLUGIN_PORT, ca), served(plugin.address, PEER_PORT, ca)
    assert main == peer  # both ports, one certificate
    assert ip_names(main) == [x509.IPAddress(ipaddress.ip_address(plugin.address))]  # the Pod IP and nothing else
    assert main.subject.rfc4514_string() == f"CN=system:gpustack-models-plugin:{plugin.node}"
    directory = TEST_STATE / "plugin" / plugin.node / "serving-tls"
    assert x509.load_pem_x509_certificate((directory / "serving.crt").read_bytes()) == main
    for name in ("serving.crt", "serving.key", "client.crt", "client.key"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    client = x509.load_pem_x509_certificate((directory / "client.crt").read_bytes())
    assert client.subject.rfc4514_string() == f"CN=system:gpustack-models-plugin:{plugin.node}"
    assert usages(client) == [ExtendedKeyUsageOID.CLIENT_AUTH] and usages(main) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert client.not_valid_after_utc == main.not_valid_after_utc  # issued and renewed together
    # The worker reads the plugin live over that certificate (progress counts its bytes as live).
    scenario.hub.faults.throttle(scenario.weights, 400_000)
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Downloading", timeout=60)
    wait_for(lambda: scenario.progress()["live"] == 1, timeout=30, message="the worker to read the plugin live")
    log = (TEST_STATE / f"plugin-{plugin.node}.log").read_text()
    issued = f"serving certificate {main.serial_number:x} and client certificate {client.serial_number:x} from the API"
    assert f"{issued} for {plugin.address}, until" in log


def test_a_plugin_waits_for_the_worker_then_renews_its_certificate(scenario, launcher, worker_api, extra_api):
    from gpustack_models.local.cluster import free_port

    port = free_port()  # the worker is not there yet
    node, address = f"node-{uuid.uuid4().hex[:5]}", "127.0.1.250"
    plugin = PluginProcess(launcher, worker_api, node, address, FROM_API)
    plugin.env["GPUSTACK_API_URL"] = f"https://127.0.0.1:{port}"
    log_path = TEST_STATE / f"plugin-{node}.log"
    try:
        with open(log_path, "ab") as log:  # started by hand: PluginProcess.start waits for it to serve
            plugin.proc = subprocess.Popen(
                [sys.executable, "-m", "gpustack_models.plugin", f"--node={node}"],
                cwd=REPO,
                env=plugin.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(
            lambda: log_path.exists() and log_path.read_text().count("no serving certificate from the API yet") >= 2,
            timeout=30,
            message="the plugin to ask again with backoff",
        )
        for p in (PLUGIN_PORT, PEER_PORT):  # nothing served meanwhile, not even without TLS
            with pytest.raises(OSError):
                socket.create_connection((address, p), timeout=2).close()
        assert plugin.proc.poll() is None
        extra_api(port, GPUSTACK_PLUGIN_CERT_SECONDS="30")  # renewed after 20 s
        first = wait_for(lambda: _served_or_none(address, launcher), timeout=90, message="the plugin to serve")
        assert ip_names(first) == [x509.IPAddress(ipaddress.ip_address(address))]
        client_file = TEST_STATE / "plugin" / node / "serving-tls" / "client.crt"
        first_client = x509.load_pem_x509_certificate(client_file.read_bytes())
        renewed = wait_for(
            lambda: (
                (c := _served_or_none(address, launcher)) is not None and c.serial_number != first.serial_number and c
            ),
            timeout=60,
            message="a renewed certificate on new connections",
        )
        assert renewed.not_valid_after_utc > first.not_valid_after_utc
        client = wait_for(  # renewed with it (written just after it), for a new key too
            lambda: (
                (c := x509.load_pem_x509_certificate(client_file.read_bytes())).serial_number
                != first_client.serial_number
                and c
            ),
            timeout=10,
            message="the renewed client certificate",
        )
        assert client.public_key().public_numbers() != first_client.public_key().public_numbers()
        assert served(address, PEER_PORT, plugin_ca(launcher)).serial_number == renewed.serial_number
    finally:
        plugin.stop()
        launcher.unregister_node(node)


def _served_or_none(address, launcher):
    try:
        return served(address, PLUGIN_PORT, plugin_ca(launcher))
    except OSError:
        return None


@pytest.fixture
def plugin_pod(launcher):
    """A node with its plugin Pod Running at an IP (no plugin process: the tokens are what matter)."""
    node, address = f"node-{uuid.uuid4().hex[:5]}", "10.77.0.5"
    launcher.register_node(node, address)
    yield node, address
    launcher.unregister_node(node)


def test_it_refuses_every_caller_but_a_plugins_pod_bound_token(worker_api, launcher, cluster, plugin_pod):
    from gpustack_models.kube.identity import plugin_user

    node, _address = plugin_pod
    body = {"csr": csr(ec.generate_private_key(ec.SECP256R1()))}
    refused(ask(worker_api, None, body), 401)
    refused(ask(worker_api, "not-a-token", body), 401)
    refused(ask(worker_api, cluster.tokens()["erin"], body), 403, "is not the node plugin")  # a tenant
    unbound = launcher.service_account_token("gpustack-models-plugin", 600)  # the plugins' account, no Pod
    assert plugin_user().endswith(":gpustack-models-plugin")
    refused(ask(worker_api, unbound, body), 403, "not bound to a Pod")
    peer_audience = launcher.plugin_token(node, audiences=["gpustack-models-peer"])  # bound, another audience
    refused(ask(worker_api, peer_audience, body), 401)
    worker = launcher.service_account_token("gpustack-models-worker", 600)
    refused(ask(worker_api, worker, body), 403)


def test_it_names_only_the_pods_ip_whatever_the_request_asks(worker_api, launcher, plugin_pod):
    node, address = plugin_pod
    token = launcher.plugin_token(node)
    key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    body = {
        "csr": csr(
            key, cn="system:masters", dns=("kubernetes.default.svc", "evil.example"), ips=("10.77.0.6", "127.0.0.1")
        ),
        "clientCsr": csr(client_key, cn="system:gpustack-models-service", ips=("10.77.0.6",)),
    }
    resp = ask(worker_api, token, body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    cert = x509.load_pem_x509_certificate(answer["certificate"].encode())
    ca = x509.load_pem_x509_certificate(answer["ca"].encode())
    assert answer["ca"].encode() == plugin_ca(launcher).read_bytes()
    cert.verify_directly_issued_by(ca)
    assert ip_names(cert) == [x509.IPAddress(ipaddress.ip_address(address))]
    assert cert.subject.rfc4514_string() == f"CN=system:gpustack-models-plugin:{node}"
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert usages(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # The client certificate names the token's node, whatever its request asked for: never the service.
    client = x509.load_pem_x509_certificate(answer["clientCertificate"].encode())
    client.verify_directly_issued_by(ca)
    assert client.subject.rfc4514_string() == f"CN=system:gpustack-models-plugin:{node}"
    assert client.public_key().public_numbers() == client_key.public_key().public_numbers()
    assert usages(client) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    with pytest.raises(x509.ExtensionNotFound):
        client.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    rsa_key = rsa.generate_private_key(65537, 2048)
    alone = ask(worker_api, token, {"csr": csr(rsa_key)})  # a plugin of an earlier version: no client certificate
    assert alone.status_code == 200 and "clientCertificate" not in alone.json()


def test_it_refuses_bad_requests_with_a_status(worker_api, launcher, plugin_pod):
    node, _address = plugin_pod
    token = launcher.plugin_token(node)
    good = csr(ec.generate_private_key(ec.SECP256R1()), cn="node-a")
    der = bytearray(x509.load_pem_x509_csr(good.encode()).public_bytes(serialization.Encoding.DER))
    der[der.index(b"node-a") : der.index(b"node-a") + 6] = b"node-b"  # signed for node-a
    forged = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM).decode()
    refused(
        ask(
            worker_api, token, {"csr": "-----BEGIN CERTIFICATE REQUEST-----\nZm9v\n-----END CERTIFICATE REQUEST-----\n"}
        ),
        400,
    )
    refused(ask(worker_api, token, {"csr": "garbage"}), 400, "exactly one PEM block")
    refused(ask(worker_api, token, {"nothing": 1}), 400)
    refused(ask(worker_api, token, {"csr": forged}), 400, "does not verify")
    refused(ask(worker_api, token, {"csr": csr(dsa.generate_private_key(2048))}), 400, "only EC P-256")
    refused(ask(worker_api, token, {"csr": csr(rsa.generate_private_key(65537, 1024))}), 400, "1024 bits")
    refused(ask(worker_api, token, {"csr": good, "clientCsr": "garbage"}), 400, "clientCsr must hold exactly one PEM")
    refused(ask(worker_api, token, {"csr": good, "clientCsr": good}), 400, "clientCsr: the client certificate needs")
    refused(ask(worker_api, token, {"csr": "A" * 2_000_000}), 413)
    s = requests.Session()
    s.trust_env = False
    raw = s.post(f"{worker_api.url}{PATH}", data=good, verify=str(worker_api.ca_file), timeout=30,
                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/pkcs10"})  # fmt: skip
    refused(raw, 415)


def test_it_issues_nothing_for_a_pod_without_an_ip_or_gone(worker_api, launcher, plugin_pod):
    from django.conf import settings

    node, address = plugin_pod
    token = launcher.plugin_token(node)
    body = {"csr": csr(ec.generate_private_key(ec.SECP256R1()))}
    assert ask(worker_api, token, body).status_code == 200
    path = f"/api/v1/namespaces/{settings.NAMESPACE}/pods/{launcher.plugin_pod_name(node)}"
    pod = launcher.admin.get(path)
    pod["status"] = {"phase": "Pending"}
    launcher.admin.json("PUT", f"{path}/status", body=pod)
    refused(ask(worker_api, token, body), 409, "no certificate before it runs")
    launcher.admin.delete(path, query={"gracePeriodSeconds": "0"})
    wait_for(lambda: _gone(launcher, path), timeout=30, message="the Pod to be gone")
    gone = ask(worker_api, token, body)
    # kube-apiserver refuses a token whose Pod is gone (401); within the worker's TokenReview cache, the
    # live read of the Pod refuses it (404). Never a certificate.
    assert gone.status_code in (401, 404), gone.text
    refused(gone, gone.status_code)


def _gone(launcher, path) -> bool:
    from gpustack_models import kube

    try:
        launcher.admin.get(path)
    except kube.NotFound:
        return True
    return False


def test_it_answers_503_when_the_api_holds_no_ca_key(launcher, extra_api, plugin_pod):
    node, _address = plugin_pod
    api = extra_api(GPUSTACK_PLUGIN_CA_KEY_FILE=str(TEST_STATE / "no-such-ca.key"))
    refused(
        ask(api, launcher.plugin_token(node), {"csr": csr(ec.generate_private_key(ec.SECP256R1()))}),
        503,
        "GPUSTACK_PLUGIN_CA_KEY_FILE",
    )


# --- The CA ConfigMap nodes read their CAs from (cert-manager mode: the API publishes it) --------------------

CA_CONFIGMAP = "gpustack-models-ca"


@pytest.fixture
def ca_configmap(launcher):
    """The path of the CA ConfigMap, absent before the test and deleted after it."""
    from django.conf import settings

    from gpustack_models import kube

    path = f"/api/v1/namespaces/{settings.NAMESPACE}/configmaps/{CA_CONFIGMAP}"

    def delete():
        try:
            launcher.admin.delete(path)
        except kube.NotFound:
            pass

    delete()
    yield path
    delete()


def ca_file(directory: Path, name: str) -> tuple[Path, str]:
    """A new CA's certificate written to ``directory/name`` (and its PEM)."""
    from gpustack_models.local import pki

    ca = pki.new_ca(name)
    path = directory / name
    path.write_bytes(ca.cert_pem)
    return path, ca.cert_pem.decode()


def test_the_api_publishes_the_ca_configmap_with_its_own_identity_and_never_a_key(
    worker_kube, launcher, ca_configmap, tmp_path
):
    from django.conf import settings

    from gpustack_models.internal.ca_bundle import NotCertificates, publish

    api_ca, api_pem = ca_file(tmp_path, "api-ca.crt")
    plugin = plugin_ca(launcher)
    args = (CA_CONFIGMAP, settings.NAMESPACE, str(api_ca), str(plugin))
    assert publish(worker_kube, *args) == "created"  # the worker's own ServiceAccount may
    data = launcher.admin.get(ca_configmap)["data"]
    assert data == {"api-ca.crt": api_pem, "plugin-ca.crt": plugin.read_text()}
    assert publish(worker_kube, *args) == "unchanged"
    _, renewed_pem = ca_file(tmp_path, "renewed.crt")
    api_ca.write_text(renewed_pem + api_pem)  # a rotation: the new CA beside the old one
    assert publish(worker_kube, *args) == "updated"
    assert launcher.admin.get(ca_configmap)["data"]["api-ca.crt"] == renewed_pem + api_pem
    # A file with a key in it is never published, not even in part: the ConfigMap keeps what it had.
    key = launcher.data_dir / "plugin-pki" / "ca.key"
    mixed = tmp_path / "mixed.crt"
    mixed.write_bytes(plugin.read_bytes() + key.read_bytes())
    for bad in (mixed, key):
        with pytest.raises(NotCertificates, match="holds a private key"):
            publish(worker_kube, CA_CONFIGMAP, settings.NAMESPACE, str(api_ca), str(bad))
    assert launcher.admin.get(ca_configmap)["data"]["plugin-ca.crt"] == plugin.read_text()
    assert "PRIVATE KEY" not in json.dumps(launcher.admin.get(ca_configmap))
    # The worker may write that one ConfigMap, no other.
    from gpustack_models import kube

    with pytest.raises(kube.Forbidden):
        publish(worker_kube, "another-configmap", settings.NAMESPACE, str(api_ca), str(plugin))


def test_an_api_process_publishes_the_ca_configmap_at_start_and_when_a_ca_file_changes(
    launcher, extra_api, ca_configmap, tmp_path
):
    api_ca, api_pem = ca_file(tmp_path, "api-ca.crt")
    extra_api(GPUSTACK_CA_CONFIGMAP=CA_CONFIGMAP, GPUSTACK_API_SERVING_CA_FILE=str(api_ca))
    published = wait_for(lambda: _data(launcher, ca_configmap), timeout=30, message="the CA ConfigMap")
    assert published == {"api-ca.crt": api_pem, "plugin-ca.crt": plugin_ca(launcher).read_text()}
    _, renewed_pem = ca_file(tmp_path, "renewed.crt")
    api_ca.write_text(renewed_pem)
    wait_for(
        lambda: (_data(launcher, ca_configmap) or {}).get("api-ca.crt") == renewed_pem,
        timeout=30,
        message="the renewed CA in the ConfigMap",
    )


def _data(launcher, path) -> dict | None:
    from gpustack_models import kube

    try:
        return launcher.admin.get(path)["data"]
    except kube.NotFound:
        return None
