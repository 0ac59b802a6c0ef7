"""Shared fixtures: the real control plane (started once per session) and clients for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpustack_models.localcluster import LocalCluster, Ports
from gpustack_models.resources.crd import crd_files

REPO = Path(__file__).resolve().parent.parent
TEST_STATE = REPO / ".local" / "test"
PLUGIN_PORT = Ports.free().apiserver  # every test plugin serves on its own loopback address, this port


@pytest.hookimpl(trylast=True)  # after pytest-django's own reordering
def pytest_collection_modifyitems(config, items):
    """Tests that stop or restart shared components run last, in their collected order. Tests of the
    worker's background processes get the test database (pytest-django creates it only when asked)."""
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)
    for item in items:
        uses_db = {"worker_stack", "worker_api"} & set(getattr(item, "fixturenames", ()))
        if uses_db and not item.get_closest_marker("django_db"):
            item.add_marker(pytest.mark.django_db)


@pytest.fixture(scope="session")
def cluster():
    """A real etcd + kube-apiserver + kube-controller-manager for the whole session, with the CRDs."""
    state = TEST_STATE / "cluster"
    if (state / "cluster.json").exists():
        LocalCluster.from_state(state).stop()
    LocalCluster(state).wipe()
    lc = LocalCluster(
        state,
        ports=Ports.free(),
        compaction_interval=os.environ.get("GPUSTACK_TEST_COMPACTION_INTERVAL", "5m"),
    )
    try:
        lc.start()
        kubectl_run(lc, "apply", "--server-side", "-f", str(REPO / "deploy" / "crds"))
        kubectl_run(lc, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield lc
    finally:
        lc.stop()


def kubectl_run(lc: LocalCluster, *args: str, token: str | None = None, check=True, input=None, cache_dir=None):
    """Run the cluster's own kubectl; returns the CompletedProcess (text)."""
    kubeconfig = lc.token_kubeconfig if token else lc.kubeconfig
    cmd = [str(lc.kubectl), f"--kubeconfig={kubeconfig}"]
    if cache_dir:
        cmd.append(f"--cache-dir={cache_dir}")
    if token:
        cmd.append(f"--token={token}")
    proc = subprocess.run(cmd + list(args), capture_output=True, text=True, input=input, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def kubectl(cluster, tmp_path):
    """kubectl with a fresh discovery cache per test (kubectl caches discovery for hours)."""

    def run(*args, **kwargs):
        kwargs.setdefault("cache_dir", str(tmp_path / "kube-cache"))
        return kubectl_run(cluster, *args, **kwargs)

    return run


@pytest.fixture(scope="session")
def api_client(cluster):
    return k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture(scope="session")
def core(api_client):
    return k8s.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def custom(api_client):
    return k8s.CustomObjectsApi(api_client)


@pytest.fixture(scope="session")
def admin_http(cluster):
    """A requests session authenticated as the cluster admin (client certificate)."""
    session = requests.Session()
    session.trust_env = False
    session.verify = str(cluster.pki_path("ca.crt"))
    session.cert = (str(cluster.pki_path("admin.crt")), str(cluster.pki_path("admin.key")))
    session.base = cluster.server
    return session


def token_http(cluster: LocalCluster, token: str) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.verify = str(cluster.pki_path("ca.crt"))
    session.headers["Authorization"] = f"Bearer {token}"
    session.base = cluster.server
    return session


@pytest.fixture
def namespace(core):
    """A fresh namespace, deleted after the test."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    yield name
    try:
        core.delete_namespace(name)
    except k8s.ApiException:
        pass


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2, message: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; return that value or fail with ``message``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message} (last: {last!r})")


def read_modify_write(session, target, change, attempts=20):
    """PUT ``change(current)`` with a requests session until no concurrent writer (the worker or a plugin,
    writing status) got in between (409 Conflict). Returns the last response."""
    import copy

    for _ in range(attempts):
        current = session.get(target).json()
        resp = session.put(target, json=change(copy.deepcopy(current)))
        if resp.status_code != 409:
            return resp
    raise AssertionError(f"PUT {target} still conflicting after {attempts} attempts")


def kube_update(client, path, change, attempts=20):
    """The same with a ``gpustack_models.kube.Kube`` client; returns the written object."""
    from gpustack_models import kube

    for _ in range(attempts):
        current = client.get(path)
        try:
            return client.json("PUT", path, body=change(current))
        except kube.KubeError as exc:
            if exc.status != 409:
                raise
    raise AssertionError(f"PUT {path} still conflicting after {attempts} attempts")


def status_of(exc: k8s.ApiException) -> dict:
    return json.loads(exc.body)


__all__ = ["crd_files", "kubectl_run", "token_http", "wait_for", "status_of"]


# --- The worker's aggregated API ------------------------------------------------------------------------


class WorkerAPI:
    """The worker's API server process, registered as APIService v1.worker.gpustack.ai."""

    def __init__(self, launcher, port: int, db_url: str):
        self.launcher = launcher
        self.port = port
        self.db_url = db_url
        self.proc = None
        self.crt, self.key, self.ca_pem = launcher.serving_pki()
        self.ca_file = launcher.pki_dir / "ca.crt"
        self.url = f"https://127.0.0.1:{port}"

    def env(self) -> dict:
        env = dict(os.environ)
        env.update(
            KUBECONFIG=str(self.launcher.worker_kubeconfig),
            GPUSTACK_DATA_DIR=str(TEST_STATE),
            DATABASE_URL=self.db_url,
            GPUSTACK_PLUGIN_PORT=str(PLUGIN_PORT),
            GPUSTACK_PROGRESS_LIVE_TIMEOUT="2",
        )
        return env

    def start(self) -> None:
        log = open(TEST_STATE / "worker-api.log", "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runapiserver",
                f"--port={self.port}",
                "--workers=2",
                f"--certfile={self.crt}",
                f"--keyfile={self.key}",
            ],
            cwd=REPO,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        session = requests.Session()
        session.trust_env = False
        wait_for(lambda: _healthy(session, self), timeout=60, message="the worker API to listen")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def session(self, *, token=None, cert=None, headers=None) -> requests.Session:
        """A client straight to the worker (not through kube-apiserver)."""
        session = requests.Session()
        session.trust_env = False
        session.verify = str(self.ca_file)
        if token:
            session.headers["Authorization"] = f"Bearer {token}"
        if cert:
            session.cert = cert
        session.headers.update(headers or {})
        session.base = self.url
        return session


def _healthy(session, api) -> bool:
    if api.proc.poll() is not None:
        raise AssertionError(f"the worker API exited with {api.proc.returncode}; see {TEST_STATE / 'worker-api.log'}")
    try:
        return session.get(f"{api.url}/healthz", verify=str(api.ca_file), timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture(scope="session")
def launcher(cluster):
    from gpustack_models.launcher import Launcher

    lc = Launcher(cluster, TEST_STATE)
    lc.install()
    lc.write_worker_kubeconfig()
    return lc


@pytest.fixture(scope="session")
def worker_api(launcher, django_db_setup, django_db_blocker):
    from gpustack_models.localcluster import free_port

    with django_db_blocker.unblock():
        url = database_url()
    api = WorkerAPI(launcher, free_port(), url)
    api.start()
    try:
        launcher.register(api.port)
        launcher.wait_available()
        yield api
    finally:
        launcher.unregister()
        api.stop()


@pytest.fixture(scope="session")
def worker_kube(launcher):
    """A client with the worker's own identity (its ServiceAccount token)."""
    from gpustack_models import kube

    return kube.Kube(kube.load_configuration(str(launcher.worker_kubeconfig)))


@pytest.fixture(scope="session")
def storage_http(cluster, launcher):
    """kube-apiserver with the worker's identity: what the admission policies let write v1alpha1."""
    import yaml

    token = yaml.safe_load(launcher.worker_kubeconfig.read_text())["users"][0]["user"]["token"]
    return token_http(cluster, token)


# --- The worker's background processes -----------------------------------------------------------------


@pytest.fixture(scope="session")
def hub():
    """A fake Hugging Face / ModelScope hub for the whole session (the worker resolves against it)."""
    from tests.fakehub import FakeHub

    with FakeHub() as fake:
        yield fake


def database_url() -> str:
    """The test database as a URL, for processes the suite starts."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}:{s.get('PASSWORD') or ''}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


class WorkerStack:
    """The worker's informers and a Celery worker (with beat), as ``make run`` starts them."""

    def __init__(self, launcher, hub, db_url):
        self.launcher = launcher
        self.hub = hub
        self.db_url = db_url
        self.procs: dict[str, subprocess.Popen] = {}

    def env(self) -> dict:
        env = dict(os.environ)
        env.update(
            KUBECONFIG=str(self.launcher.worker_kubeconfig),
            GPUSTACK_DATA_DIR=str(TEST_STATE),
            DATABASE_URL=self.db_url,
            HF_ENDPOINT=self.hub.url,
            MODELSCOPE_ENDPOINT=self.hub.url,
            GPUSTACK_RESOLVE_RETRY_BASE="0.5",
            GPUSTACK_RESOLVE_RETRY_MAX="3",
            NO_PROXY="127.0.0.1,127.0.0.2,localhost",
            no_proxy="127.0.0.1,127.0.0.2,localhost",
            HF_HOME=str(TEST_STATE / "hf-home"),
            MODELSCOPE_HOME=str(TEST_STATE / "modelscope-home"),
        )
        return env

    def start(self, name: str) -> None:
        argv = {
            "informers": [sys.executable, "manage.py", "runinformers"],
            "celery": [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "--pool=prefork",
                "--concurrency=4",
                "--beat",
                f"--schedule={TEST_STATE / 'beat-schedule'}",
                "--without-gossip",
                "--without-mingle",
                "--loglevel=WARNING",
            ],
        }[name]
        log = open(TEST_STATE / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, cwd=REPO, env=self.env(), stdout=log, stderr=subprocess.STDOUT)

    def stop(self, name: str, kill: bool = False) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.kill() if kill else proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="session")
def worker_stack(launcher, hub, django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        url = database_url()
    stack = WorkerStack(launcher, hub, url)
    stack.start("celery")
    stack.start("informers")
    try:
        yield stack
    finally:
        stack.stop("informers")
        stack.stop("celery")


@pytest.fixture
def mirror_db(django_db_blocker):
    """Read the mirror the worker writes (no per-test transaction, nothing flushed)."""
    from django.db import connection

    with django_db_blocker.unblock():
        yield
        connection.close()


# --- Node plugins -----------------------------------------------------------------------------------------


class PluginProcess:
    """One ``manage.py runplugin`` for one node, on its own loopback address and cache directory."""

    def __init__(self, launcher, worker_api, node: str, address: str, extra_env: dict):
        self.node, self.address = node, address
        self.env = launcher.plugin_env(node, address, PLUGIN_PORT)
        self.env.update(GPUSTACK_WORKER_URL=worker_api.url, NO_PROXY="*", no_proxy="*", **extra_env)
        self.cache = Path(self.env["GPUSTACK_PLUGIN_CACHE_DIR"])
        self.proc = None
        self.url = f"https://{address}:{PLUGIN_PORT}"

    def start(self):
        log = open(TEST_STATE / f"plugin-{self.node}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runplugin", f"--node={self.node}"],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        session = requests.Session()
        session.trust_env = False

        def up():
            if self.proc.poll() is not None:
                raise AssertionError(f"plugin {self.node} exited; see plugin-{self.node}.log")
            try:
                return session.get(f"{self.url}/readyz", verify=False, timeout=1).status_code == 200
            except requests.RequestException:
                return False

        import urllib3

        urllib3.disable_warnings()
        wait_for(up, timeout=30, message=f"plugin {self.node} to serve")
        return self

    def stop(self, kill=False):
        if self.proc and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture
def start_plugin(worker_stack, worker_api, launcher):
    """Start node plugins: ``start_plugin(node, address, **env)``; all stopped after the test."""
    started: list[PluginProcess] = []

    def start(node: str, address: str, **env) -> PluginProcess:
        plugin = PluginProcess(launcher, worker_api, node, address, {k: str(v) for k, v in env.items()})
        started.append(plugin)
        return plugin.start()

    yield start
    for plugin in started:
        plugin.stop()
        launcher.unregister_node(plugin.node)
