"""The whole service on one machine, as ``manage.py runlocal`` (``make run``) starts it: the local control
plane, the service installed into it, every process of the service with its log under ``logs/``, and one
local node with its plugin.

Stopping (SIGTERM or Ctrl-C to ``runlocal``) takes at most ``STOP_SECONDS``: every process of the service
gets SIGTERM at once and stops by itself (each role bounds its own stop), then the control plane, and
whatever is left at the deadlines is killed. Each process of the service runs in its own process group
(a Ctrl-C reaches ``runlocal`` alone, which stops the rest in order); the group is killed after its leader
stopped, so no grandchild (gunicorn's or Celery's worker processes) outlives it, and every child gets
SIGTERM from the kernel if ``runlocal`` itself dies.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command

from gpustack_models.local.cluster import REPO_DIR, LocalCluster, Ports
from gpustack_models.local.launcher import Launcher
from gpustack_models.local.ports import free_port
from gpustack_models.local.stopping import die_with_parent, kill_group, stop_all

log = logging.getLogger(__name__)

LOCAL_NODE = "local-node"
LOCAL_NODE_ADDRESS = "127.0.0.11"
STOP_SECONDS = 9.5  # from SIGTERM to the last process gone
SERVICE_STOP_SECONDS = 7.5  # the service's processes (each stops within 5-6 s by itself), then the control plane


def metrics_ports(setting: str) -> dict[str, int]:
    """The informers', Celery worker's and beat's metrics ports from ``GPUSTACK_LOCAL_METRICS_PORTS``."""
    roles = ("informers", "celery", "beat")
    if setting == "free":
        return {role: free_port() for role in roles}
    return dict(zip(roles, (int(p) for p in setting.split(",")), strict=True))


class ProcessExited(RuntimeError):
    """A process of the stack stopped on its own."""


class LocalStack:
    def __init__(self, data_dir: Path, console: str):
        self.data_dir = data_dir
        self.console = console
        self.cluster = LocalCluster(
            data_dir,
            ports=Ports.parse(settings.LOCAL_CLUSTER_PORTS),
            compaction_interval=settings.ETCD_COMPACTION_INTERVAL,
        )
        self.launcher: Launcher | None = None
        self.children: dict[str, subprocess.Popen] = {}
        self.log_dir = data_dir / "logs"
        self.metrics_ports = metrics_ports(settings.LOCAL_METRICS_PORTS)

    def start(self) -> None:
        """Start everything; raises ``RuntimeError`` with what failed."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.cluster.start()
        self.launcher = Launcher(self.cluster, self.data_dir)
        self.launcher.install()
        self.launcher.write_service_kubeconfig()
        call_command("migrate", interactive=False, verbosity=0)
        self.log_dir.mkdir(exist_ok=True)
        self.start_service()
        self.start_node()
        self.launcher.register(settings.API_PORT)
        try:
            self.launcher.wait_available(timeout=90)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; see {self.log_dir / 'api.log'}") from None

    def spawn(self, name: str, argv: list[str], env: dict) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")
        self.children[name] = subprocess.Popen(
            argv,
            cwd=REPO_DIR,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()

    def start_service(self) -> None:
        """The aggregated API, the console, a Celery worker, Celery beat and the informers, as the service."""
        cert, key, _ca = self.launcher.serving_pki()
        plugin_ca, plugin_ca_key = self.launcher.plugin_ca()  # the API issues the plugins' certificates
        env = dict(os.environ, KUBECONFIG=str(self.launcher.service_kubeconfig))
        env.update(GPUSTACK_PLUGIN_CA_FILE=str(plugin_ca), GPUSTACK_PLUGIN_CA_KEY_FILE=str(plugin_ca_key))
        python = sys.executable
        api = ["runapiserver", f"--port={settings.API_PORT}", f"--certfile={cert}", f"--keyfile={key}"]
        self.spawn("api", [python, "manage.py", *api], env)
        console = ["config.wsgi:application", "--bind", self.console, "--workers", "2", "--no-control-socket"]
        self.spawn("console", [python, "-m", "gunicorn", *console], env)
        celery = ["-A", "config", "worker", "--pool=prefork", "--concurrency=2", "--loglevel=WARNING"]
        celery += ["--without-gossip", "--without-mingle"]
        self.spawn("celery", [python, "-m", "celery", *celery], self.metrics_env(env, "celery"))
        self.launcher.forget_leases()  # a run killed before releasing them must not make this one wait
        beat = ["-A", "config", "beat", "--loglevel=WARNING"]
        self.spawn("beat", [python, "-m", "celery", *beat], self.metrics_env(env, "beat"))
        self.spawn("informers", [python, "manage.py", "runinformers"], self.metrics_env(env, "informers"))

    def metrics_env(self, env: dict, role: str) -> dict:
        """``env`` with the role's metrics port (``GPUSTACK_LOCAL_METRICS_PORTS``) on loopback."""
        return dict(env, GPUSTACK_METRICS_PORT=str(self.metrics_ports[role]), GPUSTACK_METRICS_ADDRESS="127.0.0.1")

    def endpoints(self) -> dict:
        """Where everything answers, as ``endpoints.json`` in the data directory records it."""
        cluster, metrics = self.cluster, self.metrics_ports
        node_dir = self.data_dir / "plugin" / LOCAL_NODE
        return {
            "kubeconfig": str(cluster.kubeconfig),
            "kubectl": str(cluster.kubectl),
            "kubeApiserver": cluster.server,
            "api": f"https://127.0.0.1:{settings.API_PORT}",
            "console": f"http://{self.console}/admin/",
            "plugin": f"https://{LOCAL_NODE_ADDRESS}:{settings.PLUGIN_PORT}",
            "csiSocket": str(node_dir / "csi.sock"),
            "cache": str(node_dir / "cache"),
            "logs": str(self.log_dir),
            # Plain HTTP; the API's own /metrics is on its HTTPS port, for authorized callers.
            "metrics": {role: f"http://127.0.0.1:{port}/metrics" for role, port in metrics.items()},
        }

    def write_endpoints(self) -> Path:
        path = self.data_dir / "endpoints.json"
        path.write_text(json.dumps(self.endpoints(), indent=2) + "\n")
        return path

    def start_node(self) -> None:
        """One local node with its plugin, registered as a kubelet would (a Node, a Running plugin Pod)."""
        env = self.launcher.plugin_env(LOCAL_NODE, LOCAL_NODE_ADDRESS, settings.PLUGIN_PORT)
        self.spawn("plugin", [sys.executable, "-m", "gpustack_models.plugin", f"--node={LOCAL_NODE}"], env)

    def banner(self) -> str:
        cluster = self.cluster
        kubectl = f"{cluster.kubectl} --kubeconfig {cluster.kubeconfig}"
        cache = self.data_dir / "plugin" / LOCAL_NODE / "cache"
        csi_socket = self.data_dir / "plugin" / LOCAL_NODE / "csi.sock"
        metrics = ", ".join(f"{role} :{port}" for role, port in self.metrics_ports.items())
        return (
            f"\ngpustack-models is running (Kubernetes {cluster.version})\n"
            f"  kubeconfig: {cluster.kubeconfig}\n"
            f"  kubectl:    {cluster.kubectl}\n"
            f"  API:        worker.gpustack.ai/v1 through {cluster.server} (the API process on :{settings.API_PORT})\n"
            f"  console:    http://{self.console}/admin/\n"
            f"  node:       {LOCAL_NODE} (plugin on {LOCAL_NODE_ADDRESS}:{settings.PLUGIN_PORT}, cache {cache})\n"
            f"  CSI:        model.csi.gpustack.ai on {csi_socket}\n"
            f"  metrics:    http://127.0.0.1 /metrics of {metrics}\n"
            f"  logs:       {self.log_dir}/ (everything above: {self.data_dir / 'endpoints.json'})\n"
            f"  try:        {kubectl} api-resources --api-group=worker.gpustack.ai\n"
            "Ctrl-C stops everything."
        )

    def supervise(self, stop: threading.Event) -> None:
        """Until ``stop``; raises ``ProcessExited`` when a process stops on its own."""
        while not stop.wait(0.5):
            for name, child in self.children.items():
                if child.poll() is not None:
                    log = self.log_dir / f"{name}.log"
                    raise ProcessExited(f"{name} exited with {child.returncode}; see {log}")

    def stop(self) -> None:
        """Stop everything within ``STOP_SECONDS`` (see the module's docstring)."""
        started = time.monotonic()
        if self.launcher is not None:
            try:
                self.launcher.unregister(timeout=1)
            except Exception:  # the control plane may already be gone
                pass
        children = list(self.children.values())
        killed = stop_all(children, started + SERVICE_STOP_SECONDS)
        for name, child in self.children.items():
            kill_group(child.pid)
            if child in killed:
                log.warning("%s did not stop within %.1f s of SIGTERM: killed", name, SERVICE_STOP_SECONDS)
        log.info("the service stopped in %.1f s", time.monotonic() - started)
        self.cluster.stop(deadline=started + STOP_SECONDS)
        log.info("everything stopped in %.1f s", time.monotonic() - started)
