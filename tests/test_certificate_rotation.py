"""Certificates rotate without an outage: a serving certificate replaced under a running API (as the kubelet
updates a cert-manager Secret volume: a new directory, the ``..data`` symlink swapped) is served to new
handshakes within a minute while kubectl loops on ``kubectl get mart`` through kube-apiserver and the
APIService stays Available; a plugin honours a replaced serving certificate and a replaced CA file, a
keep-alive connection of before the swap answering after it."""

from __future__ import annotations

import http.client
import os
import ssl
import threading
from pathlib import Path

import pytest

from gpustack_models import install
from gpustack_models.kinds import GROUP, PUBLIC_VERSION
from gpustack_models.local import pki
from gpustack_models.local.cluster import free_port
from tests.support import PLUGIN_PORT, kubectl_run, wait_for
from tests.support.plugins import SERVICE_SUBJECT, service_client_cert
from tests.support.secret_volume import served_serial, write_volume
from tests.support.worker import WorkerAPI, database_url

APISERVICE = f"/apis/apiregistration.k8s.io/v1/apiservices/{PUBLIC_VERSION}.{GROUP}"


def api_pair(authority: pki.KeyPair) -> dict[str, bytes]:
    """A serving certificate of the API's CA for its Service names and the loopback addresses."""
    names = install.serving_names()
    issued = pki.issue(authority, names[0], dns_names=names, ip_addresses=("127.0.0.1", "::1"), server=True)
    return {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem}


def serial_of(files: dict[str, bytes]) -> int:
    from cryptography import x509

    return x509.load_pem_x509_certificate(files["tls.crt"]).serial_number


class Loop:
    """Runs ``step`` until stopped, on a thread, ``pace`` seconds apart; each step returns an error text or
    ``None``."""

    def __init__(self, step, pace: float = 0.0):
        self.step, self.pace, self.runs, self.errors = step, pace, 0, []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stopping.is_set():
            try:
                error = self.step()
            except Exception as exc:  # a failed call is what the test counts, not a crash of the loop
                error = repr(exc)
            if error:
                self.errors.append(error)
            self.runs += 1
            self.stopping.wait(self.pace)

    def stop(self):
        self.stopping.set()
        self.thread.join(130)


@pytest.fixture
def rotating_api(launcher, worker_api, django_db_blocker, tmp_path):
    """An API process whose certificate is in a Secret volume, registered as the APIService for the test
    (the session's API registered again after it)."""
    authority = pki.KeyPair.load(launcher.pki_dir, "ca")
    volume, first = tmp_path / "api-tls", api_pair(authority)
    write_volume(volume, first)
    with django_db_blocker.unblock():
        url = database_url()
    api = WorkerAPI(launcher, free_port(), url)
    api.crt, api.key = volume / "tls.crt", volume / "tls.key"
    api.start()
    try:
        launcher.register(api.port)
        launcher.wait_available()
        yield api, authority, volume, first
    finally:
        launcher.register(worker_api.port)
        launcher.wait_available()
        api.stop()


def available(launcher) -> str | None:
    conditions = launcher.admin.get(APISERVICE).get("status", {}).get("conditions", [])
    state = {c["type"]: c for c in conditions}.get("Available", {})
    return None if state.get("status") == "True" else f"APIService not Available: {state}"


def test_a_serving_certificate_replaced_under_the_api_is_served_with_no_failed_request(
    rotating_api, launcher, cluster, tmp_path
):
    api, authority, volume, first = rotating_api
    assert served_serial("127.0.0.1", api.port, api.ca_file) == serial_of(first)

    def get_mart():
        proc = kubectl_run(cluster, "get", "mart", "-A", check=False, cache_dir=str(tmp_path / "kube-cache"))
        return None if proc.returncode == 0 else f"kubectl get mart failed ({proc.returncode}): {proc.stderr}"

    loops = [Loop(get_mart), Loop(lambda: available(launcher), pace=0.2)]
    try:
        wait_for(lambda: all(loop.runs >= 3 for loop in loops), timeout=60, message="the loops to run")
        renewed = api_pair(authority)
        write_volume(volume, renewed)  # as the kubelet writes the renewed Secret into the Pod's volume
        wait_for(
            lambda: served_serial("127.0.0.1", api.port, api.ca_file) == serial_of(renewed),
            timeout=60,
            interval=0.5,
            message="the API to serve the renewed certificate",
        )
        after = [loop.runs for loop in loops]  # and on: kubectl's calls and the polls after the swap count too
        wait_for(lambda: all(loop.runs >= n + 10 for loop, n in zip(loops, after)), timeout=60, message="more runs")
    finally:
        for loop in loops:
            loop.stop()
    assert loops[0].errors == [], loops[0].errors[:3]
    assert loops[1].errors == [], loops[1].errors[:3]


# --- The plugin ------------------------------------------------------------------------------------------


def plugin_connection(address: str, ca_file: Path, client) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(ca_file))
    context.check_hostname = False
    context.load_cert_chain(*(str(path) for path in client))
    return http.client.HTTPSConnection(address, PLUGIN_PORT, context=context, timeout=5)


def downloads(conn: http.client.HTTPSConnection) -> int | None:
    """The status of ``GET /model/downloads`` (the service's client certificate only); ``None`` when the
    handshake failed (with TLS 1.3, at the first read)."""
    try:
        conn.request("GET", "/model/downloads")
        response = conn.getresponse()
        response.read()
        return response.status
    except (ssl.SSLError, ConnectionError):
        return None


def replace(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` in one rename, as the plugin writes a renewed certificate."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(content)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def test_a_plugin_honours_a_replaced_ca_file_and_serving_certificate_keeping_open_connections(
    launcher, start_plugin, tmp_path
):
    ca_cert, _ca_key = launcher.plugin_ca()
    authority = pki.KeyPair.load(ca_cert.parent, "ca")
    trust = tmp_path / "ca-configmap"  # the gpustack-models-ca ConfigMap's volume
    write_volume(trust, {"plugin-ca.crt": authority.cert_pem})
    address = "127.0.0.71"
    plugin = start_plugin("rotation-node", address, GPUSTACK_PLUGIN_CA_FILE=str(trust / "plugin-ca.crt"))
    service = service_client_cert(launcher)
    kept = plugin_connection(address, ca_cert, service)
    assert downloads(kept) == 200

    rotated = pki.new_ca("gpustack-models-plugin-ca-2")  # the plugin CA rotated: the new one trusted first
    newcomer = pki.issue(rotated, SERVICE_SUBJECT, client=True).write(tmp_path, "service-2")
    assert downloads(plugin_connection(address, ca_cert, newcomer)) is None
    write_volume(trust, {"plugin-ca.crt": authority.cert_pem + rotated.cert_pem})
    wait_for(
        lambda: downloads(plugin_connection(address, ca_cert, newcomer)) == 200,
        timeout=60,
        interval=0.5,
        message="the plugin to accept a client certificate of the CA added to its trusted file",
    )

    cert_dir = Path(plugin.env["GPUSTACK_DATA_DIR"]) / "plugin" / plugin.node / "serving-tls"
    renewed = pki.issue(authority, plugin.node, ip_addresses=(address,), server=True)
    replace(cert_dir / "serving.key", renewed.key_pem)  # key first, as the plugin's renewal writes them
    replace(cert_dir / "serving.crt", renewed.cert_pem)
    wait_for(
        lambda: served_serial(address, PLUGIN_PORT, ca_cert) == renewed.cert.serial_number,
        timeout=60,
        interval=0.5,
        message="the plugin to serve its replaced certificate",
    )
    assert downloads(kept) == 200, "the connection opened before the swaps stopped answering"
    kept.close()
