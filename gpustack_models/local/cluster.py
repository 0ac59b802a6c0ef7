"""A local Kubernetes control plane of real components: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler.

The binaries are built from the Kubernetes Go modules by ``deploy/controlplane/build.sh`` into a cache
outside the repository. ``LocalCluster`` generates the PKI, starts the four processes, waits until they
are healthy, can restart kube-apiserver alone, and stops everything: the binaries and the command lines
are ``components``'s, the files of the state directory (PKI, tokens, configs, kubeconfigs) ``statedir``'s,
the ports ``ports``'s. kube-apiserver is set up for real
nodes (Node authorizer, NodeRestriction, a kubelet client certificate) although none runs by default:
the test suite adds a real kubelet where a test asks for one. Its state directory holds:

    pki/            cluster CA, serving and client certificates (admin, kube-scheduler, kube-apiserver's
                    kubelet client and admission webhook client), front-proxy CA, service-account keys
    etcd/           etcd's data (kept across restarts of the same state directory)
    logs/           one log per component
    audit/audit.log kube-apiserver's audit log (Metadata level for the groups tests count)
    kubeconfig      an admin kubeconfig (scheduler-kubeconfig: kube-scheduler's own)
    admission-config.yaml, admission-kubeconfig
                    the client certificate kube-apiserver presents to every admission webhook
    bin/kubectl     the matching kubectl
    tokens.json     static tenant users and their bearer tokens (tokens.csv is the apiserver's file)
    cluster.json    ports and process ids, so a later command can stop what an earlier one started
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import requests
import urllib3

from gpustack_models.local.components import REPO_DIR, CommandLines, ensure_binaries, kube_version
from gpustack_models.local.ports import Ports, free_port, primary_address
from gpustack_models.local.statedir import CLIENT_CERTS, TENANT_GROUP, WEBHOOK_CLIENT_USER, StateDir
from gpustack_models.local.stopping import die_with_parent, stop_all

__all__ = [
    "CLIENT_CERTS",
    "REPO_DIR",
    "STOP_SECONDS",
    "TENANT_GROUP",
    "WEBHOOK_CLIENT_USER",
    "LocalCluster",
    "Ports",
    "free_port",
    "kube_version",
]

log = logging.getLogger(__name__)

STOP_SECONDS = 8.0  # SIGTERM to SIGKILL for the whole control plane


class LocalCluster:
    def __init__(
        self,
        state_dir: Path,
        *,
        ports: Ports | None = None,
        compaction_interval: str = "5m",
        advertise_address: str | None = None,
        bin_dir: Path | None = None,
        die_with_parent: bool = True,
    ):
        self.state_dir = Path(state_dir).resolve()
        self.ports = ports or Ports.defaults()
        self.compaction_interval = compaction_interval
        self.advertise_address = advertise_address or primary_address()
        self.bin_dir = bin_dir
        self.die_with_parent = die_with_parent
        self.procs: dict[str, subprocess.Popen] = {}
        self.files = StateDir(self.state_dir, self.ports, self.advertise_address)
        self.pki_dir = self.files.pki_dir
        self.log_dir = self.files.log_dir
        self.audit_log = self.files.audit_log
        self.kubeconfig = self.files.kubeconfig
        self.scheduler_kubeconfig = self.files.scheduler_kubeconfig
        self.token_kubeconfig = self.files.token_kubeconfig
        self.kubectl = self.files.kubectl

    # --- paths and facts -------------------------------------------------------------------------------
    @property
    def server(self) -> str:
        return self.files.server

    @property
    def version(self) -> str:
        return kube_version()

    def tokens(self) -> dict[str, str]:
        return self.files.tokens()

    def pki_path(self, name: str) -> Path:
        return self.files.pki_path(name)

    def write_kubeconfig(self, path: Path, cert: Path, key: Path, user: str = "admin") -> Path:
        """A kubeconfig for this cluster that authenticates with the client certificate ``cert``/``key``."""
        return self.files.write_kubeconfig(path, cert, key, user)

    # --- set-up --------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Binaries, PKI, token file, audit policy, admission config and kubeconfigs. Existing PKI is kept
        and completed: only missing files are generated (a state directory from an earlier version gains
        the certificates it lacks; a new cluster CA reissues everything it signs)."""
        if self.bin_dir is None:
            self.bin_dir = ensure_binaries()
        self.files.prepare(self.bin_dir)

    def _commands(self) -> CommandLines:
        return CommandLines(self.files, self.bin_dir, self.ports, self.advertise_address, self.compaction_interval)

    # --- processes -----------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log_file = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen(
            args,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.state_dir,
            start_new_session=True,
            preexec_fn=die_with_parent if self.die_with_parent else None,  # stops when its launcher dies
        )
        log_file.close()
        self.procs[name] = proc
        self._save_state()
        return proc

    def _save_state(self) -> None:
        state = {
            "ports": asdict(self.ports),
            "advertiseAddress": self.advertise_address,
            "binDir": str(self.bin_dir),
            "pids": {name: proc.pid for name, proc in self.procs.items() if proc.poll() is None},
        }
        (self.state_dir / "cluster.json").write_text(json.dumps(state, indent=2))

    @classmethod
    def from_state(cls, state_dir: Path) -> LocalCluster:
        """The cluster an earlier process started in ``state_dir`` (for stop/status)."""
        state = json.loads((Path(state_dir) / "cluster.json").read_text())
        cluster = cls(
            state_dir,
            ports=Ports(**state["ports"]),
            advertise_address=state["advertiseAddress"],
            bin_dir=Path(state["binDir"]),
        )
        return cluster

    def _recorded_pids(self) -> dict[str, int]:
        try:
            state = json.loads((self.state_dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}
        alive = {}
        for name, pid in state.get("pids", {}).items():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(self.state_dir).encode() in cmdline or str(self.kubeconfig).encode() in cmdline:
                alive[name] = pid
        return alive

    def kill_leftovers(self) -> None:
        """Stop components a crashed earlier launcher left running on this state directory."""
        leftovers = self._recorded_pids()
        for name, pid in leftovers.items():
            log.warning("stopping %s (pid %d) left by an earlier run", name, pid)
        stop_all(leftovers.values(), time.monotonic() + STOP_SECONDS)

    def start(self, timeout: float = 180.0) -> None:
        self.prepare()
        self.kill_leftovers()
        t0 = time.monotonic()
        commands = self._commands()
        self._spawn("etcd", commands.etcd())
        self._wait("etcd", f"http://127.0.0.1:{self.ports.etcd_client}/health", timeout)
        self._start_apiserver(timeout)
        self._spawn("kube-controller-manager", commands.controller_manager())
        self._spawn("kube-scheduler", commands.scheduler())
        self._wait("kube-controller-manager", f"https://127.0.0.1:{self.ports.controller_manager}/healthz", timeout)
        self._wait("kube-scheduler", f"https://127.0.0.1:{self.ports.scheduler}/healthz", timeout)
        log.info(
            "control plane %s ready in %.1fs at %s (kubeconfig %s)",
            self.version,
            time.monotonic() - t0,
            self.server,
            self.kubeconfig,
        )

    def _start_apiserver(self, timeout: float) -> None:
        self._spawn("kube-apiserver", self._commands().apiserver())
        self._wait("kube-apiserver", f"{self.server}/readyz", timeout)

    def restart_apiserver(self, timeout: float = 180.0) -> None:
        """Stop kube-apiserver alone and start it again on the same etcd."""
        stop_all(self._take(("kube-apiserver",), self._recorded_pids()), time.monotonic() + STOP_SECONDS)
        self._start_apiserver(timeout)

    def compact_etcd(self) -> int:
        """Compact etcd's history at its newest revision (and free it on disk); the revision. A watch resumed from
        an earlier resourceVersion is answered 410 Expired by etcd, and by a kube-apiserver started after this (a
        running one's watch cache may still hold that version)."""
        etcd = f"http://127.0.0.1:{self.ports.etcd_client}/v3/kv"
        session = requests.Session()
        session.trust_env = False
        revision = int(session.post(f"{etcd}/range", json={"key": "AA=="}, timeout=10).json()["header"]["revision"])
        session.post(f"{etcd}/compaction", json={"revision": revision, "physical": True}, timeout=30).raise_for_status()
        return revision

    def stop(self, deadline: float | None = None) -> None:
        """SIGTERM kube-scheduler, kube-controller-manager and kube-apiserver together, then etcd once they
        are gone (kube-apiserver uses it while it stops); SIGKILL what is left at ``deadline`` (a
        ``time.monotonic()``; default ``STOP_SECONDS`` from now)."""
        deadline = deadline or time.monotonic() + STOP_SECONDS
        recorded = self._recorded_pids()
        stop_all(self._take(("kube-scheduler", "kube-controller-manager", "kube-apiserver"), recorded), deadline - 1.5)
        stop_all(self._take(("etcd",), recorded) + list(recorded.values()), deadline)
        self._save_state()

    def _take(self, names: tuple[str, ...], recorded: dict[str, int]) -> list:
        """The processes of ``names``, ours or recorded by an earlier launcher, removed from both."""
        targets = []
        for name in names:
            proc, pid = self.procs.pop(name, None), recorded.pop(name, None)
            if proc is not None or pid:
                targets.append(proc if proc is not None else pid)
        return targets

    def is_running(self) -> bool:
        return bool(self._recorded_pids())

    # --- health --------------------------------------------------------------------------------------
    def _wait(self, name: str, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        session = requests.Session()
        session.trust_env = False  # REQUESTS_CA_BUNDLE or a proxy from the environment must not apply here
        if url.startswith(self.server):
            session.verify = str(self.pki_path("ca.crt"))
            session.cert = (str(self.pki_path("admin.crt")), str(self.pki_path("admin.key")))
        else:
            session.verify = False
        last = ""
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; last log lines:\n{self.tail_log(name)}")
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
                    resp = session.get(url, timeout=5)
                if resp.status_code == 200:
                    return
                last = f"{resp.status_code} {resp.text[-300:]}"
            except requests.RequestException as exc:
                last = str(exc)
            time.sleep(0.25)
        raise RuntimeError(f"{name} not healthy after {timeout:.0f}s ({last}); log:\n{self.tail_log(name)}")

    def tail_log(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.log_dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def audit_events(self) -> list[dict]:
        """Every event in the audit log so far (the active file only)."""
        events = []
        try:
            with open(self.audit_log) as fh:
                for line in fh:
                    line = line.strip()
                    if line:
                        events.append(json.loads(line))
        except FileNotFoundError:
            pass
        return events

    def wipe(self) -> None:
        """Remove the whole state directory (the cluster must be stopped)."""
        shutil.rmtree(self.state_dir, ignore_errors=True)
