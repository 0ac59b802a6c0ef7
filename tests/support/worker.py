"""Fixtures: the worker's processes as ``make run`` starts them (the aggregated API, the informers, a
Celery worker and Celery beat), the fake hub they resolve against, and clients with the worker's identity."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
import requests

from tests.support import lanes
from tests.support.kubernetes import token_http
from tests.support.paths import PEER_PORT, PLUGIN_PORT, REPO, TEST_STATE
from tests.support.waiting import wait_for


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
            KUBECONFIG=str(self.launcher.service_kubeconfig),
            GPUSTACK_DATA_DIR=str(TEST_STATE),
            DATABASE_URL=self.db_url,
            GPUSTACK_PLUGIN_PORT=str(PLUGIN_PORT),
            GPUSTACK_PLUGIN_PEER_PORT=str(PEER_PORT),
            GPUSTACK_PROGRESS_LIVE_TIMEOUT="2",
        )
        ca, ca_key = self.launcher.plugin_ca()  # the API signs the plugins' certificates with this CA's key
        env.update(GPUSTACK_PLUGIN_CA_FILE=str(ca), GPUSTACK_PLUGIN_CA_KEY_FILE=str(ca_key))
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
        try:
            wait_for(lambda: _healthy(session, self), timeout=60, message="the worker API to listen")
        except BaseException:
            self.stop()  # not left running (a session that failed here has no teardown for it)
            raise

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
    from gpustack_models.local.launcher import Launcher

    lc = Launcher(cluster, TEST_STATE)
    lc.install()
    lc.write_service_kubeconfig()
    return lc


# The kinds the probe deletes (plural, namespaced, spec): what the tests that need the collector delete.
PROBES = (
    ("nodemodelstores", False, {}),
    ("modelartifacts", True, {"source": {"huggingFace": {"repository": "org/gc-probe"}}}),
)
KINDS = {"nodemodelstores": "NodeModelStore", "modelartifacts": "ModelArtifact"}


class GarbageCollectorProbe(threading.Thread):
    """Tells when kube-controller-manager's garbage collector handles the aggregated v1 kinds.

    The collector learns deletable resources from discovery, again every 30 s: until it has learnt the
    APIService's, an orphan or foreground deletion of its kinds (their objects carry a finalizer only the
    collector removes) waits. Started as the APIService becomes available, beside the tests that need none
    of it: a NodeModelStore deleted with ``propagationPolicy: Orphan`` is gone once the collector has."""

    def __init__(self, service):
        super().__init__(name="gc-probe", daemon=True)
        self.admin, self.seconds, self.error = service, None, None

    def run(self) -> None:
        from gpustack_models.kinds import GROUP

        started = time.monotonic()
        try:
            for plural, namespaced, spec in PROBES:
                path = f"/apis/{GROUP}/v1alpha1/{'namespaces/default/' if namespaced else ''}{plural}"
                self.orphaned(path, {"apiVersion": f"{GROUP}/v1alpha1", "kind": KINDS[plural], "spec": spec})
            self.seconds = time.monotonic() - started
        except BaseException as exc:  # reported to the test that waits for it
            self.error = exc

    def orphaned(self, path: str, body: dict) -> None:
        """An object of ``path`` created and deleted with ``propagationPolicy: Orphan``: gone once collected."""
        from gpustack_models import kube

        name = f"gc-probe-{uuid.uuid4().hex[:8]}"
        self.admin.create(path, dict(body, metadata={"name": name}))
        orphan = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Orphan"}
        self.admin.delete(f"{path}/{name}", body=orphan)

        def gone():
            try:
                self.admin.get(f"{path}/{name}")
            except kube.NotFound:
                return True
            return False

        wait_for(gone, timeout=150, interval=0.5, message=f"the garbage collector to handle {path}")

    def wait(self) -> float:
        self.join(160)
        if self.error is not None or self.seconds is None:
            raise AssertionError(f"the garbage collector never handled the v1 kinds: {self.error!r}")
        return self.seconds


@pytest.fixture(scope="session")
def worker_api(launcher, django_db_setup, django_db_blocker):
    from gpustack_models.local.cluster import free_port

    with django_db_blocker.unblock():
        url = database_url()
    api = WorkerAPI(launcher, free_port(), url)
    api.start()
    try:
        launcher.register(api.port)
        launcher.wait_available()
        from gpustack_models import kube  # the service's identity: the only one the storage takes writes from

        api.gc_probe = GarbageCollectorProbe(kube.Kube(kube.load_configuration(str(launcher.service_kubeconfig))))
        api.gc_probe.start()
        yield api
    finally:
        launcher.unregister()
        api.stop()


@pytest.fixture
def garbage_collector(worker_api):
    """For a test whose deletions need the garbage collector: waits (once) until it handles the v1 kinds."""
    return worker_api.gc_probe.wait()


@pytest.fixture(scope="session")
def worker_kube(launcher):
    """A client with the worker's own identity (its ServiceAccount token)."""
    from gpustack_models import kube

    return kube.Kube(kube.load_configuration(str(launcher.service_kubeconfig)))


@pytest.fixture(scope="session")
def storage_http(cluster, launcher):
    """kube-apiserver with the worker's identity: what the admission policies let write v1alpha1."""
    import yaml

    token = yaml.safe_load(launcher.service_kubeconfig.read_text())["users"][0]["user"]["token"]
    return token_http(cluster, token)


# --- The worker's background processes -----------------------------------------------------------------


@pytest.fixture(scope="session")
def hub():
    """A fake Hugging Face / ModelScope hub for the whole session (the worker resolves against it)."""
    from tests.fakehub import FakeHub

    with FakeHub() as fake:
        yield fake


@pytest.fixture
def own_hub():
    """A fake hub only this test's workers talk to: its request log is theirs alone (the session's worker
    resolves nothing it holds)."""
    from tests.fakehub import FakeHub

    with FakeHub() as fake:
        yield fake


@pytest.fixture
def db_url(django_db_setup, django_db_blocker):
    """The test database's URL, for the worker processes a test starts."""
    with django_db_blocker.unblock():
        return database_url()


def own_broker(index: int) -> str:
    """Redis database ``index`` (1 or more) of the lane, emptied: a broker no other worker of the suite reads."""
    import redis

    url = os.environ.get("CELERY_BROKER_URL", "")
    if not url.startswith("redis"):
        pytest.fail("the suite runs with its Redis broker (make test)")
    url = lanes.redis_url(url, index)
    redis.Redis.from_url(url).flushdb()
    return url


def celery_worker_argv(concurrency: int) -> list[str]:
    """A Celery worker of the product's app, run as its own process (prefork; no gossip or mingle: a test's
    worker has no others to talk to)."""
    return [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=prefork", f"--concurrency={concurrency}",
            "--without-gossip", "--without-mingle", "--loglevel=INFO"]  # fmt: skip


def database_url() -> str:
    """The test database as a URL, for processes the suite starts."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return postgres_url(s)


def postgres_url(s: dict) -> str:
    """A PostgreSQL database's URL from its Django connection settings."""
    return f"postgres://{s['USER']}:{s.get('PASSWORD') or ''}@{s['HOST']}:{s['PORT']}/{s['NAME']}"


MIRROR_LAG_FILE = TEST_STATE / "mirror-lag.jsonl"
COLLECTION_GRACE = 8  # seconds: GPUSTACK_COLLECTION_GRACE_SECONDS of the suite's worker
# Seconds between two collection passes of the suite's beat. A pass schedules what falls due before the next
# one at its own time, so this costs no test time, only background work in every lane (a pass a second took
# about 2 s of CPU a minute in each lane's beat and worker).
COLLECTION_INTERVAL = 2
MODELS_PER_NODE = 16  # GPUSTACK_MODELS_PER_NODE of the suite's worker: the per-node cap within tens of digests
# The roles' metrics ports: connections open at once, seconds for a request's head (the attack tests' scale).
METRICS_MAX_CONNECTIONS = 16
METRICS_REQUEST_SECONDS = 5


class WorkerStack:
    """The worker's informers, a Celery worker and Celery beat, as ``make run`` starts them."""

    def __init__(self, launcher, hub, db_url):
        self.launcher = launcher
        self.hub = hub
        self.db_url = db_url
        self.procs: dict[str, subprocess.Popen] = {}
        self.metrics_ports: dict[str, int] = {}  # each role's GPUSTACK_METRICS_PORT, kept across restarts
        self.extra_env: dict[str, str] = {}  # a test's own settings, for the roles it (re)starts

    def env(self) -> dict:
        env = dict(os.environ)
        env.update(
            KUBECONFIG=str(self.launcher.service_kubeconfig),
            GPUSTACK_DATA_DIR=str(TEST_STATE),
            DATABASE_URL=self.db_url,
            HF_ENDPOINT=self.hub.url,
            MODELSCOPE_ENDPOINT=self.hub.url,
            # The suite's registry (tests/support/registry.py) listens on loopback, over plain HTTP.
            GPUSTACK_OCI_INSECURE_REGISTRIES="127.0.0.1",
            GPUSTACK_RESOLVE_RETRY_BASE="0.5",
            GPUSTACK_RESOLVE_RETRY_MAX="3",
            # The cache's lifecycle on a test's time scale: collection checked every 2 s, an 8 s grace.
            GPUSTACK_COLLECTION_INTERVAL_SECONDS=str(COLLECTION_INTERVAL),
            GPUSTACK_MOUNT_CHECK_INTERVAL_SECONDS="3",
            GPUSTACK_COLLECTION_GRACE_SECONDS=str(COLLECTION_GRACE),
            GPUSTACK_MODELS_PER_NODE=str(MODELS_PER_NODE),
            GPUSTACK_SECRET_CHECK_INTERVAL_SECONDS="5",
            # Every mirrored event's arrival and commit, for the lag tests and the mirror benchmark.
            GPUSTACK_MIRROR_LAG_FILE=str(MIRROR_LAG_FILE),
            # One replica of each: no leader election, so tests that kill the informers or restart
            # kube-apiserver find them acting at once (tests/test_leader_election.py tests the election).
            GPUSTACK_LEADER_ELECTION="false",
            NO_PROXY="127.0.0.1,127.0.0.2,localhost",
            no_proxy="127.0.0.1,127.0.0.2,localhost",
            HF_HOME=str(TEST_STATE / "hf-home"),
            MODELSCOPE_HOME=str(TEST_STATE / "modelscope-home"),
        )
        env.update(self.extra_env)
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
                "--without-gossip",
                "--without-mingle",
                "--loglevel=WARNING",
            ],
            "beat": [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "beat",
                f"--schedule={TEST_STATE / 'beat-schedule'}",
                "--loglevel=INFO",
            ],
        }[name]
        from gpustack_models.local.cluster import free_port

        if name not in self.metrics_ports:  # served as a deployment's roles serve it
            self.metrics_ports[name] = free_port()
        env = dict(
            self.env(),
            GPUSTACK_METRICS_ADDRESS="127.0.0.1",
            GPUSTACK_METRICS_MAX_CONNECTIONS=str(METRICS_MAX_CONNECTIONS),
            GPUSTACK_METRICS_REQUEST_SECONDS=str(METRICS_REQUEST_SECONDS),
        )
        env["GPUSTACK_METRICS_PORT"] = str(self.metrics_ports[name])
        log = open(TEST_STATE / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

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


_session_stack: WorkerStack | None = None  # the session's stack once a test started it


@contextlib.contextmanager
def without_session_stack():
    """Stop the session's worker stack, if running, for a block whose own roles must do all the work (its
    informers would otherwise see the block's objects and its Celery worker act on them first); start it
    again after (its informers relist)."""
    stack = _session_stack
    running = [name for name in ("informers", "beat", "celery") if stack and name in stack.procs]
    for name in running:
        stack.stop(name)
    try:
        yield
    finally:
        for name in reversed(running):
            stack.start(name)


@pytest.fixture(scope="session")
def worker_stack(launcher, hub, django_db_setup, django_db_blocker):
    global _session_stack
    with django_db_blocker.unblock():
        url = database_url()
    stack = WorkerStack(launcher, hub, url)
    _session_stack = stack
    stack.start("celery")
    stack.start("beat")
    stack.start("informers")
    try:
        yield stack
    finally:
        stack.stop("informers")
        stack.stop("beat")
        stack.stop("celery")
        _session_stack = None


@pytest.fixture
def mirror_db(django_db_blocker):
    """Read the mirror the worker writes (no per-test transaction, nothing flushed)."""
    from django.db import connection

    with django_db_blocker.unblock():
        yield
        connection.close()
