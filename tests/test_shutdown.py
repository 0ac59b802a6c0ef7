"""Every role stops within 10 s of SIGTERM while it works, handing back what it was doing: the API ends its
open watches, the informers close theirs and lose no event they saw, a Celery worker finishes a short
task and hands a long one back to the broker (the next worker runs it), beat stops between ticks, a node
plugin checkpoints its download (the next start resumes it), and ``runlocal`` (``make run``) stops every
process it started, the control plane included, leaving no process and no listening port behind."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from gpustack_models.kinds import GROUP
from gpustack_models.local.cluster import free_port
from gpustack_models.local.ports import local_port_range
from tests.support import REPO, wait_for
from tests.support.worker import WorkerStack, celery_worker_argv, own_broker
from tests.test_plugins import big_files

# The test database (pytest-django names it only for tests that use it), for the roles started here.
pytestmark = pytest.mark.django_db

BOUND = 10.0  # seconds from SIGTERM to exit, for every role
STORAGE = f"/apis/{GROUP}/v1alpha1"


def spawn(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    """A role as its own process group (so what it leaves behind can be found)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


class RunQueue:
    """How long the threads of some processes waited for a CPU while ready to run, from now until ``close``
    (the kernel's ``schedstat``, read every 20 ms): what the load of the machine took from them, not what they
    did or waited for themselves. ``close`` gives the longest wait of any one thread (no more than the time
    their work was held up)."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.first: dict[tuple[int, str], int] = {}
        self.last: dict[tuple[int, str], int] = {}
        self.stop = threading.Event()
        self.sample()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        for pid in self.pids:
            try:
                threads = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue  # gone
            for tid in threads:
                try:
                    waited = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                self.first.setdefault((pid, tid), waited)
                self.last[(pid, tid)] = waited

    def run(self) -> None:
        while not self.stop.wait(0.02):
            self.sample()

    def close(self) -> float:
        self.stop.set()
        self.thread.join(5)
        return max((self.last[key] - self.first[key] for key in self.last), default=0) / 1e9


def sigterm_and_time(proc: subprocess.Popen, log: Path | None = None) -> tuple[float, float]:
    """SIGTERM ``proc``; seconds until it exited, and the longest any thread of it or its descendants waited
    for a CPU meanwhile (``RunQueue``). Fails past twice the bound, killing its group."""
    queue = RunQueue([proc.pid, *descendants(proc.pid)])
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(2 * BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        raise AssertionError(f"still running {2 * BOUND:.0f} s after SIGTERM; log: {tail(log)}") from None
    finally:
        waited = queue.close()
    seconds = time.monotonic() - started
    print(f"{' '.join(proc.args[1:4])}: exited {seconds:.2f} s after SIGTERM, {waited:.2f} s of it waiting for a CPU")
    return seconds, waited


def within_bound(stop: tuple[float, float], what: str, log: Path | None = None, bound: float = BOUND) -> None:
    """The stop took less than ``bound`` besides the time the machine kept it waiting for a CPU."""
    seconds, waited = stop
    assert seconds - waited < bound, (
        f"{what} stopped {seconds:.1f} s after SIGTERM ({waited:.1f} s waiting for a CPU); {tail(log)}"
    )


def metrics_port() -> tuple[int, str]:
    """A port for a role's ``GPUSTACK_METRICS_PORT`` and the URL it serves there."""
    port = free_port()
    return port, f"http://127.0.0.1:{port}/metrics"


def scrape(url: str) -> str | None:
    try:
        return requests.get(url, timeout=5).text
    except requests.RequestException:
        return None


def sample(url: str, name: str, **labels) -> float:
    """The value of one sample on a metrics port (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = wait_for(lambda: scrape(url), timeout=30, message=f"the metrics port {url}")
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return found.value
    return 0.0


def group_left(pgid: int) -> list[str]:
    """The processes still running in process group ``pgid`` (``pid command`` each; a zombie has
    exited, only not been reaped yet by its new parent)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    left = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if entry.name.isdigit() and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"{entry.name} {command[:200]}")
        except (OSError, IndexError, ValueError):
            continue
    return left


def tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def create_artifact(kube, namespace: str, name: str, repository: str) -> dict:
    """A ModelArtifact as kube-apiserver stores it (the storage version): the created object."""
    return kube.create(
        f"{STORAGE}/namespaces/{namespace}/modelartifacts",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": name},
            "spec": {"source": {"huggingFace": {"repository": repository}}},
        },
    )


def broker_messages(data_dir: Path) -> list[str]:
    """The bodies (JSON text) of the task messages in the file broker of ``data_dir``."""
    bodies = []
    for path in (data_dir / "celery" / "broker" / "queue").glob("*.msg"):
        try:
            message = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written
        bodies.append(message["headers"]["task"] + " " + base64.b64decode(message["body"]).decode())
    return bodies


# --- the API ------------------------------------------------------------------------------------------


def test_the_gunicorn_hooks_the_api_extends_to_stop_exist():
    """An upgrade renaming them would silently bring back stops at the graceful timeout: fail here."""
    from gunicorn.asgi.protocol import ASGIProtocol
    from gunicorn.workers import gasgi

    from gpustack_models.api.server import TLSASGIProtocol, TLSASGIWorker

    for name in ("handle_exit_signal", "handle_quit_signal"):
        assert callable(getattr(gasgi.ASGIWorker, name, None)) and name in TLSASGIWorker.__dict__
    for name in ("_close_transport", "_arm_keepalive_timer", "_cancel_keepalive_timer"):
        assert callable(getattr(ASGIProtocol, name, None)) and name in TLSASGIProtocol.__dict__, name
    assert callable(getattr(ASGIProtocol, "_keepalive_timeout", None))  # what closes an idle connection


def test_the_api_keeps_idle_connections_longer_than_kube_apiservers_proxy():
    """kube-apiserver's proxy reuses an idle connection to the API for up to 90 s (Go's default): were the API to
    close it first, a request the proxy sent on it meanwhile would fail with 503 "error trying to reach service"."""
    from gpustack_models.management.commands.runapiserver import gunicorn_options

    options = gunicorn_options(2)
    assert int(options[options.index("--keep-alive") + 1]) > 90


def closed(sock: ssl.SSLSocket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):  # aborted rather than closed: closed all the same
        return True


def _complete(answer: bytes) -> bool:
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return len(body) >= int(length.group(1)) if length else body.endswith(b"0\r\n\r\n")


def idle_connection(api, cert) -> ssl.SSLSocket:
    """A TLS connection to ``api`` that has had one answer and waits, kept alive, for its next request."""
    context = ssl.create_default_context(cafile=str(api.ca_file))
    context.load_cert_chain(*cert)
    sock = context.wrap_socket(
        socket.create_connection(("127.0.0.1", api.port), timeout=10), server_hostname="127.0.0.1"
    )
    sock.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = b""
    while not _complete(answer):
        chunk = sock.recv(4096)
        assert chunk, f"the API closed the connection after {answer!r}"
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" not in answer.lower(), answer
    return sock


def test_the_api_ends_its_open_watches_and_stops_within_10s(
    launcher, cluster, worker_kube, namespace, db_url, tmp_path
):
    from tests.support.worker import WorkerAPI

    create_artifact(worker_kube, namespace, "watched", "org/nowhere")
    api = WorkerAPI(launcher, free_port(), db_url)
    log = tmp_path / "api.log"
    argv = [sys.executable, "manage.py", "runapiserver", f"--port={api.port}", "--workers=2"]
    proc = spawn(argv + [f"--certfile={api.crt}", f"--keyfile={api.key}"], api.env(), log)
    try:
        session = api.session(
            cert=(str(cluster.pki_path("front-proxy-client.crt")), str(cluster.pki_path("front-proxy-client.key"))),
            headers={"X-Remote-User": "admin", "X-Remote-Group": "system:masters"},
        )
        wait_for(lambda: _answers(session, api.url, proc), timeout=60, message="the API to listen")
        url = f"{api.url}/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts?watch=true&timeoutSeconds=300"
        watches = [Watch(session, url) for _ in range(4)]
        for watch in watches:
            wait_for(lambda w=watch: w.events, timeout=30, message="the watch to relay the artifact")
        idle = [idle_connection(api, session.cert) for _ in range(4)]  # as kube-apiserver's proxy keeps them
        sent = time.monotonic()
        stop = sigterm_and_time(proc, log)
        for sock in idle:
            assert closed(sock), "an idle connection was still open after the API stopped"
        # By itself: not killed by gunicorn at its 5 s graceful timeout, which open watches used to reach
        # (gunicorn logs a worker it kills: "was sent SIGKILL").
        within_bound(stop, "the API", log, bound=5)
        assert "was sent SIGKILL" not in log.read_text(errors="replace"), tail(log)
        for watch in watches:
            watch.thread.join(5)
            assert watch.ended_after is not None, "a watch was still open after the API stopped"
            # Ended cleanly (the chunked stream's last chunk: a killed worker breaks it instead), well before
            # the 5 s graceful timeout that would have killed the worker.
            assert watch.error is None, f"the watch broke instead of ending: {watch.error}"
            ended = watch.ended_after - sent
            assert ended - stop[1] < 3.5, f"a watch ended {ended:.1f} s after SIGTERM ({stop[1]:.1f} s for a CPU)"
        assert not group_left(proc.pid), f"gunicorn left processes behind: {group_left(proc.pid)}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _answers(session, url, proc) -> bool:
    assert proc.poll() is None, "the API exited at start"
    try:
        return session.get(f"{url}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


class Watch:
    """One watch read on its own thread: its events, when and how it ended."""

    def __init__(self, session, url):
        self.events: list[dict] = []
        self.ended_after: float | None = None
        self.error: Exception | None = None
        self.resp = session.get(url, stream=True, timeout=(5, 60))
        assert self.resp.status_code == 200, self.resp.text
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        try:
            for line in self.resp.iter_lines():
                if line:
                    self.events.append(json.loads(line))
        except Exception as exc:
            self.error = exc
        self.ended_after = time.monotonic()


# --- the informers --------------------------------------------------------------------------------------


def test_the_informers_close_their_watches_and_lose_no_event_within_10s(launcher, worker_kube, namespace, tmp_path):
    env = dict(os.environ, KUBECONFIG=str(launcher.service_kubeconfig), GPUSTACK_DATA_DIR=str(tmp_path))
    env["GPUSTACK_LEADER_INFORMERS_LEASE"] = f"shutdown-{uuid.uuid4().hex[:8]}"  # its own: leader at once
    env.pop("CELERY_BROKER_URL", None)  # the file broker under tmp_path: what the informers sent, read back
    env.pop("CELERY_RESULT_BACKEND", None)
    port, metrics = metrics_port()
    env.update(GPUSTACK_METRICS_PORT=str(port), GPUSTACK_METRICS_ADDRESS="127.0.0.1")
    env["GPUSTACK_INFORMER_BATCH_SECONDS"] = "60"  # the events it sees stay buffered until the stop sends them
    log = tmp_path / "informers.log"
    proc = spawn([sys.executable, "manage.py", "runinformers"], env, log)
    try:
        # Each informer lists, then opens its watch at once and blocks in a read while nothing changes.
        wait_for(
            lambda: sum("record_informer" in m for m in broker_messages(tmp_path)) >= 6,
            timeout=60,
            message="the six informers to list",
        )
        added = {"resource": "modelartifacts", "type": "ADDED"}
        before = sample(metrics, "gpustack_models_informer_events_total", **added)
        names = [f"seen-{i}-{uuid.uuid4().hex[:6]}" for i in range(5)]
        for name in names:
            create_artifact(worker_kube, namespace, name, "org/nowhere")
        # The events reached the informer (its watch is open) and wait in its buffer: the stop must send them.
        wait_for(
            lambda: sample(metrics, "gpustack_models_informer_events_total", **added) >= before + len(names),
            timeout=30,
            message="the informer to see the five artifacts",
        )
        within_bound(sigterm_and_time(proc, log), "the informers", log)
        assert proc.returncode == 0, tail(log)
        sent = "\n".join(broker_messages(tmp_path))
        assert all(name in sent for name in names), f"events lost at the stop: {[n for n in names if n not in sent]}"
        assert not group_left(proc.pid), group_left(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


# --- Celery worker and beat ------------------------------------------------------------------------------


def resolved_commit(kube, namespace: str, name: str) -> str | None:
    obj = kube.get(f"{STORAGE}/namespaces/{namespace}/modelartifacts/{name}")
    resolved = (obj.get("status") or {}).get("resolved") or {}
    return resolved.get("revision") if resolved.get("manifestDigest") else None


def test_a_celery_worker_finishes_short_tasks_hands_long_ones_back_and_stops_within_10s(
    launcher, worker_kube, namespace, own_hub, db_url, tmp_path, monkeypatch
):
    from celery import Celery

    short, long = f"org/short-{uuid.uuid4().hex[:6]}", f"org/long-{uuid.uuid4().hex[:6]}"
    commits = {repo: own_hub.add_hf_repo(repo, {"config.json": repo.encode()}) for repo in (short, long)}
    create_artifact(worker_kube, namespace, "short", short)
    create_artifact(worker_kube, namespace, "long", long)
    held = own_hub.faults.delay(f"/api/models/{long}/revision", seconds=120)  # in flight past any grace
    own_hub.faults.delay(f"/api/models/{short}/revision", seconds=3)  # finishes within the grace
    broker = own_broker(1)
    env = dict(WorkerStack(launcher, own_hub, db_url).env(), CELERY_BROKER_URL=broker, CELERY_RESULT_BACKEND=broker)
    env.update(GPUSTACK_HUB_TIMEOUT="300", GPUSTACK_CELERY_SHUTDOWN_GRACE_SECONDS="5")
    argv = celery_worker_argv(2)
    log = tmp_path / "celery.log"
    first = spawn(argv + ["-n", "first@%h"], env, log)
    try:
        monkeypatch.setenv("CELERY_BROKER_URL", broker)  # Celery prefers it to the app's own broker
        # Not the current app: the suite's shared tasks must keep resolving to the product's own app.
        with Celery("client", broker=broker, set_as_current=False) as client:
            for name in ("long", "short"):
                client.send_task("gpustack_models.resolve_artifact", args=[namespace, name])

        def asked(repo):
            return [r for r in own_hub.requests if r.path.startswith(f"/api/models/{repo}/revision")]

        wait_for(lambda: asked(long) and asked(short), timeout=60, message="both resolutions in flight")
        within_bound(sigterm_and_time(first, log), "the worker", log)
        assert not group_left(first.pid), f"processes outlived the worker: {group_left(first.pid)}"
        # The short task finished before the worker stopped; the long one did not and was not acknowledged.
        assert resolved_commit(worker_kube, namespace, "short") == commits[short]
        assert len(asked(short)) == 1
        assert resolved_commit(worker_kube, namespace, "long") is None
        assert len(asked(long)) == 1
        second = spawn(argv + ["-n", "second@%h"], env, log)
        try:
            wait_for(
                lambda: resolved_commit(worker_kube, namespace, "long"),
                timeout=60,
                message=f"the long task delivered again and done; log: {tail(log)}",
            )
        finally:
            sigterm_and_time(second, log)
        assert resolved_commit(worker_kube, namespace, "long") == commits[long]
        assert len(asked(long)) == 2 and len(asked(short)) == 1  # each task ran to its end once
    finally:
        held.release()
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)


def test_celery_beat_stops_within_10s(launcher, tmp_path, db_url):
    env = dict(
        os.environ, GPUSTACK_DATA_DIR=str(tmp_path), DATABASE_URL=db_url, GPUSTACK_COLLECTION_INTERVAL_SECONDS="1"
    )
    # The worker's identity, for its Lease (its own: leader at once).
    env.update(
        KUBECONFIG=str(launcher.service_kubeconfig), GPUSTACK_LEADER_BEAT_LEASE=f"shutdown-{uuid.uuid4().hex[:8]}"
    )
    env.pop("CELERY_BROKER_URL", None)
    env.pop("CELERY_RESULT_BACKEND", None)
    log = tmp_path / "beat.log"
    argv = [sys.executable, "-m", "celery", "-A", "config", "beat", f"--schedule={tmp_path / 'schedule'}"]
    proc = spawn(argv + ["--loglevel=INFO"], env, log)
    try:
        wait_for(
            lambda: sum("gpustack_models.collect" in m for m in broker_messages(tmp_path)) >= 2,
            timeout=60,
            message="beat to send the collection pass twice",
        )
        within_bound(sigterm_and_time(proc, log), "beat", log)
        assert not group_left(proc.pid), group_left(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


# --- the node plugin ---------------------------------------------------------------------------------------


def metric(plugin, name: str) -> float:
    text = requests.get(f"{plugin.url}/metrics", verify=False, timeout=5).text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"no {name} in the plugin's metrics"
    return float(match.group(1))


def test_a_plugin_checkpoints_its_download_stops_within_10s_and_resumes(scenario, hub):
    scenario.artifact(files=big_files(scenario.repo, mb=8))
    size = len(scenario.files["model.safetensors"])
    (plugin,) = scenario.plugins(1)
    hub.faults.throttle(scenario.weights, 700_000, times=None)  # ~12 s: in flight when SIGTERM comes
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Downloading")
    checkpoint = plugin.cache / "partial" / scenario.digest.split(":", 1)[1] / "checkpoint.json"

    def hashed() -> int:
        try:
            files = json.loads(checkpoint.read_text()).get("files") or {}
        except (OSError, ValueError):
            return 0
        return (files.get("model.safetensors") or {}).get("hashed") or 0

    wait_for(lambda: hashed() >= 1_000_000, timeout=60, message="a checkpoint past 1 MB")
    within_bound(sigterm_and_time(plugin.proc), "the plugin")
    kept = hashed()
    assert 1_000_000 <= kept < size
    assert scenario.entry(plugin.node)["state"] == "Downloading"  # not failed: resumed at the next start
    before = len(hub.requests)
    hub.faults.clear()
    plugin.start()
    scenario.wait_state(plugin.node, "Ready", timeout=120)
    assert metric(plugin, "gpustack_models_plugin_resumed_bytes_total") >= kept
    after = [r for r in hub.requests[before:] if scenario.weights in r.path and r.method == "GET"]
    starts = [int(r.range.split("=")[1].split("-")[0]) for r in after if r.range]
    assert starts and min(starts) >= kept, f"the restart asked again from {starts}"
    assert sum(r.bytes_sent for r in after) <= size - kept
    assert (scenario.tree(plugin) / "model.safetensors").read_bytes() == scenario.files["model.safetensors"]


# --- make run ----------------------------------------------------------------------------------------------


def descendants(root: int) -> dict[int, tuple[int, str]]:
    """Every process below ``root``: pid -> (process group, start time)."""
    children: dict[int, list[int]] = {}
    info = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        info[pid] = (int(fields[2]), fields[19])
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = info[child]
            todo.append(child)
    return found


def still_running(pid: int, start_time: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == start_time and fields[0] != "Z"


def listening(ports: set[int]) -> set[int]:
    """Which of ``ports`` a socket listens on (any address, IPv4 or IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == "0A" and port in ports:
                found.add(port)
    return found


def _split_lane_ports(monkeypatch) -> dict:
    """The lane's ports halved: the lower half for what this test picks, the upper for what runlocal picks. Both
    stay out of the kernel's ephemeral range, where a port picked free may be some connection's source port by the
    time a process binds it (kube-controller-manager once failed so: "address already in use")."""
    span = local_port_range()
    if span is None:
        return {}
    first, last = span
    middle = (first + last) // 2
    monkeypatch.setenv("GPUSTACK_LOCAL_PORTS", f"{first}-{middle}")
    return {"GPUSTACK_LOCAL_PORTS": f"{middle + 1}-{last}"}


def test_make_run_stops_every_process_it_started_within_10s(monkeypatch):
    data_dir = Path(tempfile.mkdtemp(prefix="gpm-run-"))  # short: the CSI socket's path is bounded
    theirs = _split_lane_ports(monkeypatch)
    api_port, plugin_port, console_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSTACK_") or k == "GPUSTACK_KUBE_CACHE"}
    env.update(theirs)
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "KUBECONFIG"):
        env.pop(name, None)  # its own SQLite and file broker, as `make run` on a fresh checkout
    env.update(
        GPUSTACK_DATA_DIR=str(data_dir),
        GPUSTACK_LOCAL_CLUSTER_PORTS="free",  # never the suite's control plane, nor another run's
        GPUSTACK_API_PORT=str(api_port),
        GPUSTACK_PLUGIN_PORT=str(plugin_port),
        GPUSTACK_CONSOLE_ADDR=f"127.0.0.1:{console_port}",
        GPUSTACK_LOCAL_METRICS_PORTS="free",
    )
    log = data_dir / "runlocal.log"
    proc = spawn([sys.executable, "manage.py", "runlocal"], env, log)
    started: dict[int, tuple[int, str]] = {}
    try:
        wait_for(lambda: _running(proc, log), timeout=300, interval=1, message="runlocal to start")
        cluster_ports = set(json.loads((data_dir / "cluster.json").read_text())["ports"].values())
        endpoints = json.loads((data_dir / "endpoints.json").read_text())  # what it started, listed for people
        metrics = {int(urlsplit(url).port) for url in endpoints["metrics"].values()}
        assert endpoints["console"] == f"http://127.0.0.1:{console_port}/admin/" and len(metrics) == 3, endpoints
        ports = cluster_ports | {api_port, plugin_port, console_port} | metrics
        wait_for(lambda: listening(ports) == ports, timeout=60, message=f"every port to listen ({ports})")
        # One replica of each: the informers lead at once (a Lease left by a killed run is deleted first).
        informers_log = data_dir / "logs" / "informers.log"
        led = wait_for(
            lambda: re.search(r"became leader of lease \S+ as \S+ after ([\d.]+) s", _text(informers_log)),
            timeout=60,
            message="the informers to lead",
        )
        assert float(led.group(1)) < 3.0, led.group(0)
        for role, url in endpoints["metrics"].items():  # every role without an HTTP server serves its metrics
            scraped = requests.get(url, timeout=10)
            assert scraped.status_code == 200 and "gpustack_models_" in scraped.text, (role, scraped.status_code)
        started = descendants(proc.pid)
        groups = {pgid for pgid, _ in started.values()} | {proc.pid}
        assert len(started) >= 12, started  # control plane, API, console, Celery, beat, informers, plugin
        within_bound(sigterm_and_time(proc, log), "runlocal", log)
        left = [pid for pid, (_, start) in started.items() if still_running(pid, start)]
        assert not left, f"processes left running: {left}"
        assert not [group_left(g) for g in groups if group_left(g)], "a process group it started has processes"
        assert not listening(ports), f"ports still listening: {listening(ports)}"
        assert "stopped" in log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pgid in {pgid for pgid, _ in started.values()}:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(data_dir, ignore_errors=True)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _running(proc, log) -> bool:
    assert proc.poll() is None, f"runlocal exited with {proc.returncode}: {tail(log)}"
    return "gpustack-models is running" in log.read_text(errors="replace")
