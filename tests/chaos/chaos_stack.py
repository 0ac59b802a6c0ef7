"""The whole product as the chaos run needs it, every part a real process it may kill and start again: its own
PostgreSQL and Redis (restartable, unlike the suite's shared ones), two API replicas behind a relay standing in
for their Service, two informers and two Celery beats electing leaders on Leases of their own, a Celery
worker, and five node plugins (one on a small tmpfs volume whose disk can be filled, one whose wall clock
can be stepped). The session's control plane and fake hub are shared; the session's own worker roles are
stopped for the run (``without_session_stack``) and the APIService is given back to the session's API after.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpustack_models import kube
from gpustack_models.local.cluster import free_port
from gpustack_models.local.launcher import Launcher
from tests.services import PostgreSQL, Redis
from tests.support.paths import PEER_PORT, PLUGIN_PORT, REPO
from tests.support.plugins import PluginProcess
from tests.support.relay import Relay
from tests.support.waiting import wait_for

# Leases of the run's own, with the product's timings (15 s, renew deadline 10 s): a leader outlives a
# kube-apiserver restart, as in a cluster, and a killed one is replaced within 15 s.
LEASES = {"GPUSTACK_LEADER_INFORMERS_LEASE": "chaos-informers", "GPUSTACK_LEADER_BEAT_LEASE": "chaos-beat"}
DISK_NODE, CLOCK_NODE = 3, 4  # which plugins have the small volume and the steppable clock
DISK_BYTES = 192 * 1024 * 1024
PEER_RATE = 4 * 1024 * 1024  # bytes/s each plugin serves its peers: a copy between nodes takes long enough to cut


class Role:
    """One role's container: its process group, started, killed with SIGKILL (the whole group, as a container
    dies: gunicorn's or Celery's children with their parent), started again as a kubelet restarts it."""

    def __init__(self, name: str, argv: list[str], env: dict, log: Path):
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> Role:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # and whatever of the group is left


class Plugin(PluginProcess):
    """A node plugin the chaos run kills and starts again (its process ``Role``-like)."""

    name = property(lambda self: f"plugin {self.node}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        self.stop(kill=True)

    def start_again(self) -> None:
        self.launch().wait_ready()

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Endpoint:
    url: str  # what PluginProcess reads of the session's API: where a plugin reaches the API


def clock_shim(root: Path) -> Path:
    """The wall-clock step library (``clockshift.c``), compiled once per source into the run's directory."""
    source = Path(__file__).with_name("clockshift.c")
    built = root / f"clockshift-{hashlib.sha256(source.read_bytes()).hexdigest()[:12]}.so"
    if not built.exists():
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(built), str(source), "-ldl"], check=True)
    return built


class ChaosStack:
    """Every role of the product on its own datastores, against the session's control plane and hub."""

    def __init__(self, cluster, hub, root: Path):
        self.cluster, self.hub, self.root = cluster, hub, root
        root.mkdir(parents=True, exist_ok=True)
        self.postgres, self.redis = PostgreSQL(), Redis()
        self.launcher = Launcher(cluster, root)
        self.roles: dict[str, Role] = {}
        self.plugins: list[Plugin] = []
        self.relay: Relay | None = None
        self.api_ports: list[int] = []
        self._turn = itertools.count()

    # --- the environment every worker role shares -------------------------------------------------------
    def env(self) -> dict:
        env = dict(os.environ)
        ca, ca_key = self.launcher.plugin_ca()
        env.update(
            KUBECONFIG=str(self.launcher.service_kubeconfig),
            GPUSTACK_DATA_DIR=str(self.root),
            DATABASE_URL=self.database_url,
            CELERY_BROKER_URL=self.broker_url,
            CELERY_RESULT_BACKEND=self.broker_url,
            HF_ENDPOINT=self.hub.url,
            MODELSCOPE_ENDPOINT=self.hub.url,
            HF_HOME=str(self.root / "hf-home"),
            MODELSCOPE_HOME=str(self.root / "modelscope-home"),
            GPUSTACK_PLUGIN_PORT=str(PLUGIN_PORT),
            GPUSTACK_PLUGIN_PEER_PORT=str(PEER_PORT),
            GPUSTACK_PLUGIN_CA_FILE=str(ca),
            GPUSTACK_PLUGIN_CA_KEY_FILE=str(ca_key),
            GPUSTACK_PROGRESS_LIVE_TIMEOUT="2",
            GPUSTACK_RESOLVE_RETRY_BASE="0.5",
            GPUSTACK_RESOLVE_RETRY_MAX="3",
            GPUSTACK_COLLECTION_INTERVAL_SECONDS="2",
            GPUSTACK_MOUNT_CHECK_INTERVAL_SECONDS="3",
            GPUSTACK_COLLECTION_GRACE_SECONDS="8",
            GPUSTACK_MODELS_PER_NODE="128",
            GPUSTACK_LEADER_ELECTION="true",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
            **LEASES,
        )
        for name in ("GPUSTACK_METRICS_PORT", "GPUSTACK_MIRROR_LAG_FILE", "GPUSTACK_LEADER_LEASE_SECONDS",
                     "GPUSTACK_LEADER_RENEW_DEADLINE_SECONDS", "GPUSTACK_LEADER_RETRY_SECONDS"):  # fmt: skip
            env.pop(name, None)
        return env

    # --- start and stop -----------------------------------------------------------------------------------
    def start(self, nodes: int = 5) -> ChaosStack:
        self.database_url = self.postgres.start()
        self.broker_url = self.redis.start()
        self.launcher.write_service_kubeconfig()  # the CRDs, RBAC and policies: the session's launcher's
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=self.env(), check=True)
        self._start_apis()
        self._start_workers()
        self._start_plugins(nodes)
        return self

    def _role(self, name: str, argv: list[str], env: dict | None = None) -> Role:
        role = Role(name, argv, env or self.env(), self.root / f"{name}.log").start()
        self.roles[name] = role
        return role

    def _start_apis(self) -> None:
        crt, key, _ca = self.launcher.serving_pki()
        for name in ("api-a", "api-b"):
            port = free_port()
            self.api_ports.append(port)
            argv = [sys.executable, "manage.py", "runapiserver", f"--port={port}", "--workers=1",
                    f"--certfile={crt}", f"--keyfile={key}"]  # fmt: skip
            self._role(name, argv)
        self.relay = Relay(("127.0.0.1", 0), self._api_targets)
        self.launcher.register(self.relay.port)
        self.launcher.wait_available(timeout=120)

    def _api_targets(self) -> list[tuple[str, int]]:
        """Both replicas, the first one in turn: a Service's spreading, and its failing over."""
        first = next(self._turn) % 2
        ports = self.api_ports[first:] + self.api_ports[:first]
        return [("127.0.0.1", port) for port in ports]

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.relay.port}"

    def _start_workers(self) -> None:
        celery = [sys.executable, "-m", "celery", "-A", "config"]
        for index in (1, 2):
            self._role(f"informers-{index}", [sys.executable, "manage.py", "runinformers"])
            schedule = self.root / f"beat-schedule-{index}"
            self._role(f"beat-{index}", celery + ["beat", f"--schedule={schedule}", "--loglevel=INFO"])
        self._role("celery", celery + ["worker", "--pool=prefork", "--concurrency=3", "--without-gossip",
                                       "--without-mingle", "--loglevel=WARNING"])  # fmt: skip

    def _start_plugins(self, count: int) -> None:
        shim = clock_shim(self.root)
        for index in range(count):
            node = f"chaos-{os.urandom(3).hex()}-{index}"
            env = {
                "GPUSTACK_PLUGIN_RETRY_BASE": "2",
                "GPUSTACK_PLUGIN_PROGRESS_INTERVAL": "2",
                "GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS": "2",
                "GPUSTACK_PLUGIN_PEER_MAX_BYTES_PER_SECOND": str(PEER_RATE),
                "GPUSTACK_PLUGIN_KUBELET_DIR": str(self.kubelet_dir),
            }
            if index == DISK_NODE:
                env["GPUSTACK_PLUGIN_CACHE_DIR"] = str(self._small_volume(node) / "cache")
            if index == CLOCK_NODE:
                self.clock_file.write_text("0\n")
                env.update(LD_PRELOAD=str(shim), CLOCK_SHIFT_FILE=str(self.clock_file))
            plugin = Plugin(self.launcher, Endpoint(self.api_url), node, f"127.0.3.{index + 1}", env)
            self.plugins.append(plugin.launch())
        for plugin in self.plugins:
            plugin.wait_ready()

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def clock_file(self) -> Path:
        return self.root / "clock-shift"

    def volume(self, plugin: Plugin) -> Path:
        return self.root / "volumes" / plugin.node

    def _small_volume(self, node: str) -> Path:
        volume = self.root / "volumes" / node
        volume.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(volume)], check=True)
        return volume

    def stop(self) -> None:
        running = [proc for p in self.plugins for proc in (p.proc, p.mounter)] + [r.proc for r in self.roles.values()]
        for proc in (p for p in running if p is not None and p.poll() is None):
            proc.terminate()  # all at once: each stops within seconds, together rather than in turn
        for plugin in self.plugins:
            plugin.stop() if plugin.alive() else None
        for role in self.roles.values():
            role.stop()
        if self.relay:
            self.relay.close()
        self.launcher.unregister(timeout=10)
        for plugin in self.plugins:
            self.launcher.unregister_node(plugin.node)
            try:  # its store: nothing of the run's is left for the session's worker to find
                self.launcher.admin.delete(f"/apis/worker.gpustack.ai/v1alpha1/nodemodelstores/{plugin.node}")
            except kube.StatusError:
                pass
        for mounted in sorted(self.kubelet_dir.rglob("mount"), key=lambda p: -len(p.parts)):
            subprocess.run(["umount", "-l", str(mounted)], check=False, capture_output=True)
        for volume in (self.root / "volumes").glob("*"):
            subprocess.run(["umount", "-l", str(volume)], check=False, capture_output=True)
        self.redis.stop()
        self.postgres.stop()

    # --- what the checks read -----------------------------------------------------------------------------
    def kube(self) -> kube.Kube:
        return kube.Kube(kube.load_configuration(str(self.launcher.service_kubeconfig)))

    def wait_healthy(self, timeout: float = 120) -> None:
        """Until every role runs again and the APIService answers through kube-apiserver."""
        for role in list(self.roles.values()):
            if not role.alive():
                role.start()
        for plugin in self.plugins:
            if not plugin.alive():
                plugin.start_again()
        wait_for(self._available, timeout=timeout, interval=0.5, message="the APIService to answer")

    def _available(self) -> bool:
        try:
            self.launcher.admin.get("/apis/worker.gpustack.ai/v1")
            return True
        except (kube.StatusError, OSError):
            return False
