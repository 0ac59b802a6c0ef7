"""Fixtures: real node plugins (``python -m gpustack_models.plugin``), one per loopback address and cache directory."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from gpustack_models.local import pki
from tests.support.paths import PEER_PORT, PLUGIN_PORT, REPO, TEST_STATE
from tests.support.waiting import wait_for

SERVICE_SUBJECT = "system:gpustack-models-service"  # the subject of the API's client certificate


class PluginProcess:
    """One ``python -m gpustack_models.plugin`` for one node, on its own loopback address and cache directory."""

    def __init__(self, launcher, worker_api, node: str, address: str, extra_env: dict, register: bool = True):
        # split: the Pod's two containers, ``--role mounter`` and ``--role node``, as two processes.
        self.split = extra_env.pop("split", "") == "True"
        self.mounter = None
        self.node, self.address = node, address
        self.env = launcher.plugin_env(node, address, PLUGIN_PORT, register=register, peer_port=PEER_PORT)
        self.env.update(GPUSTACK_API_URL=worker_api.url, NO_PROXY="*", no_proxy="*", **extra_env)
        self.cache = Path(self.env["GPUSTACK_PLUGIN_CACHE_DIR"])
        default_socket = Path(self.env["GPUSTACK_DATA_DIR"]) / "plugin" / node / "csi.sock"
        self.csi_socket = Path(self.env.get("GPUSTACK_PLUGIN_CSI_SOCKET") or default_socket)  # its CSI driver
        self.proc = None
        self.url = f"https://{address}:{PLUGIN_PORT}"
        self.peer_url = f"https://{address}:{PEER_PORT}"  # its peer endpoints

    def launch(self):
        """Start the process; ``wait_ready`` waits for it to serve."""
        roles = [("mounter", "-mounter"), ("node", "")] if self.split else [("all", "")]
        for role, suffix in roles:
            log = open(TEST_STATE / f"plugin-{self.node}{suffix}.log", "ab")
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpustack_models.plugin", f"--node={self.node}", f"--role={role}"],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            if role == "mounter":
                self.mounter = proc
            else:
                self.proc = proc
        return self

    def wait_ready(self):
        session = requests.Session()
        session.trust_env = False

        def up():
            if self.proc.poll() is not None or (self.mounter is not None and self.mounter.poll() is not None):
                raise AssertionError(f"plugin {self.node} exited; see plugin-{self.node}*.log")
            if self.mounter is not None and not self.csi_socket.exists():
                return False
            try:
                return session.get(f"{self.url}/readyz", verify=False, timeout=1).status_code == 200
            except requests.RequestException:
                return False

        import urllib3

        urllib3.disable_warnings()
        wait_for(up, timeout=30, interval=0.05, message=f"plugin {self.node} to serve")
        return self

    def start(self):
        return self.launch().wait_ready()

    def stop(self, kill=False):
        for proc in (self.proc, self.mounter):
            if proc and proc.poll() is None:
                proc.kill() if kill else proc.terminate()
        for proc in (self.proc, self.mounter):
            if proc:
                proc.wait(30)


@pytest.fixture
def start_plugin(worker_stack, worker_api, launcher):
    """Start node plugins: ``start_plugin(node, address, **env)`` starts one and waits until it serves;
    ``start_plugin.many([(node, address), ...], **env)`` starts them all at once, then waits for each. All
    are stopped after the test."""
    started: list[PluginProcess] = []

    def make(node: str, address: str, env: dict) -> PluginProcess:
        plugin = PluginProcess(launcher, worker_api, node, address, {k: str(v) for k, v in env.items()})
        started.append(plugin)
        return plugin

    def start(node: str, address: str, **env) -> PluginProcess:
        return make(node, address, env).start()

    def many(where: list[tuple[str, str]], **env) -> list[PluginProcess]:
        plugins = [make(node, address, env).launch() for node, address in where]
        return [plugin.wait_ready() for plugin in plugins]

    start.many = many
    yield start
    for plugin in started:
        for proc in (plugin.proc, plugin.mounter):
            if proc is not None and proc.poll() is None:
                proc.terminate()  # all at once: each stops within seconds, together rather than in turn
    for plugin in started:
        plugin.stop()
        launcher.unregister_node(plugin.node)


def client_cert(plugin: PluginProcess) -> tuple[str, str]:
    """(certificate, key) files of the client certificate the API issued ``plugin`` (for its peers)."""
    directory = Path(plugin.env["GPUSTACK_DATA_DIR"]) / "plugin" / plugin.node / "serving-tls"
    return str(directory / "client.crt"), str(directory / "client.key")


def service_client_cert(launcher) -> tuple[str, str]:
    """(certificate, key) files of a client certificate of the service, as the API makes its own (from the
    plugin CA's key, which only the API holds): what reads a plugin's live bytes."""
    directory = launcher.data_dir / "plugin-pki"
    launcher.plugin_ca()
    authority = pki.KeyPair.load(directory, "ca")
    pair = pki.issue(authority, SERVICE_SUBJECT, client=True, validity=datetime.timedelta(hours=1))
    return tuple(str(p) for p in pair.write(directory, "service-client"))
