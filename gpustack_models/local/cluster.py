"""A local Kubernetes control plane of real components: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler.

The binaries are built from the Kubernetes Go modules by ``deploy/controlplane/build.sh`` into a cache
outside the repository. ``LocalCluster`` generates the PKI, starts the four processes, waits until they
are healthy, can restart kube-apiserver alone, and stops everything. kube-apiserver is set up for real
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
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import requests
import urllib3
import yaml

from gpustack_models.local import pki
from gpustack_models.local.stopping import die_with_parent, stop_all

log = logging.getLogger(__name__)

STOP_SECONDS = 8.0  # SIGTERM to SIGKILL for the whole control plane

REPO_DIR = Path(__file__).resolve().parents[2]
CONTROLPLANE_DIR = REPO_DIR / "deploy" / "controlplane"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
AUDITED_GROUPS = ("worker.gpustack.ai", "authentication.k8s.io", "authorization.k8s.io")
TENANT_USERS = ("alice", "bob", "carol", "dave", "erin")
TENANT_GROUP = "gpustack:tenants"
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    # Remove the kubernetes.io/pvc-protection and pv-protection finalizers once nothing uses the object
    # (without them deleting a PersistentVolumeClaim never completes).
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    # Deletes Pods bound to a Node that no longer exists, and terminated Pods beyond a threshold.
    "pod-garbage-collector-controller",
    # The chart's plugin DaemonSet on a real node (a DaemonSet's Pods go only where its selector says).
    "daemonset-controller",
)
# The user kube-apiserver authenticates as when it calls an admission webhook (client certificate
# ``pki/webhook-client.crt``, no group), so a webhook can tell kube-apiserver from anyone else.
WEBHOOK_CLIENT_USER = "kube-apiserver-admission"
# Client certificates signed by the cluster CA: file name -> (user, groups).
CLIENT_CERTS = {
    "admin": ("kubernetes-admin", ("system:masters",)),
    # The bootstrap RBAC binds system:kube-scheduler and system:volume-scheduler to this user.
    "kube-scheduler": ("system:kube-scheduler", ()),
    # kube-apiserver's identity towards kubelets (logs, exec, port-forward), authorized by their webhook.
    "kubelet-client": ("kube-apiserver-kubelet-client", ("system:masters",)),
    "webhook-client": (WEBHOOK_CLIENT_USER, ()),
}


def kube_version() -> str:
    """The Kubernetes version pinned in the control plane's go.mod (the one place it is pinned)."""
    match = re.search(
        r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v1\.\S+)", (CONTROLPLANE_DIR / "go.mod").read_text(), re.M
    )
    if match:
        return match.group(1)
    raise RuntimeError("no k8s.io/kubernetes version in deploy/controlplane/go.mod")


def ensure_binaries() -> Path:
    """Build (or reuse) the control plane binaries; returns their directory. Progress goes to stderr."""
    proc = subprocess.run([str(CONTROLPLANE_DIR / "build.sh")], stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building the control plane failed (exit {proc.returncode}); see the output above")
    return Path(proc.stdout.strip().splitlines()[-1])


_handed: set[int] = set()  # ports this process handed out (one may not be bound yet)


def local_port_range() -> tuple[int, int] | None:
    """``GPUSTACK_LOCAL_PORTS=FIRST-LAST``: the only ports ``free_port`` hands out (unset: any the kernel
    offers), so local stacks side by side on one host (the test suite's lanes) never pick the same port."""
    value = os.environ.get("GPUSTACK_LOCAL_PORTS", "").strip()
    if not value:
        return None
    try:
        first, last = (int(part) for part in value.split("-"))
    except ValueError:
        raise RuntimeError(f"GPUSTACK_LOCAL_PORTS={value!r}: expected FIRST-LAST, e.g. 20000-21999") from None
    if not 1024 <= first < last <= 65535:
        raise RuntimeError(f"GPUSTACK_LOCAL_PORTS={value!r}: expected 1024 <= FIRST < LAST <= 65535")
    return first, last


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on: any (the kernel's choice), or one of ``GPUSTACK_LOCAL_PORTS``."""
    span = local_port_range()
    if span is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    first, last = span
    for _ in range(2):  # the second time round, ports handed out long ago may be free again
        start = secrets.randbelow(last - first + 1)
        for offset in range(last - first + 1):
            port = first + (start + offset) % (last - first + 1)
            if port not in _handed and _bindable(port):
                _handed.add(port)
                return port
        _handed.clear()
    raise RuntimeError(f"no free port left in GPUSTACK_LOCAL_PORTS={first}-{last}")


def primary_address() -> str:
    """A non-loopback IPv4 address of this host for --advertise-address (kube-apiserver refuses loopback)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent; this only picks the outgoing interface
            address = s.getsockname()[0]
        if not address.startswith("127."):
            return address
    except OSError:
        pass
    # With --endpoint-reconciler-type=none the address is only advertised, never dialled.
    return "192.0.2.10"


@dataclass
class Ports:
    apiserver: int
    etcd_client: int
    etcd_peer: int
    controller_manager: int
    scheduler: int = 10259  # a default: cluster.json written before the scheduler has no such port

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port())

    @classmethod
    def defaults(cls) -> Ports:
        return cls(apiserver=6443, etcd_client=12379, etcd_peer=12380, controller_manager=10257, scheduler=10259)

    @classmethod
    def parse(cls, value: str) -> Ports:
        """``GPUSTACK_LOCAL_CLUSTER_PORTS``: five ports in the order of the fields, or ``free``."""
        if value.strip() == "free":
            return cls.free()
        return cls(*(int(port) for port in value.split(",")))


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
        self.pki_dir = self.state_dir / "pki"
        self.log_dir = self.state_dir / "logs"
        self.audit_log = self.state_dir / "audit" / "audit.log"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.scheduler_kubeconfig = self.state_dir / "scheduler-kubeconfig"
        self.token_kubeconfig = self.state_dir / "token-kubeconfig"
        self.kubectl = self.state_dir / "bin" / "kubectl"

    # --- paths and facts -------------------------------------------------------------------------------
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def version(self) -> str:
        return kube_version()

    def tokens(self) -> dict[str, str]:
        return json.loads((self.state_dir / "tokens.json").read_text())

    def pki_path(self, name: str) -> Path:
        return self.pki_dir / name

    # --- set-up --------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Binaries, PKI, token file, audit policy, admission config and kubeconfigs. Existing PKI is kept
        and completed: only missing files are generated (a state directory from an earlier version gains
        the certificates it lacks; a new cluster CA reissues everything it signs)."""
        if self.bin_dir is None:
            self.bin_dir = ensure_binaries()
        for sub in (self.pki_dir, self.log_dir, self.audit_log.parent, self.kubectl.parent):
            sub.mkdir(parents=True, exist_ok=True)
        self._ensure_pki()
        if not (self.state_dir / "tokens.json").exists():
            self._write_tokens()
        self._write_audit_policy()
        self._write_admission_config()
        self._write_kubeconfig()
        self.write_kubeconfig(
            self.scheduler_kubeconfig, self.pki_path("kube-scheduler.crt"), self.pki_path("kube-scheduler.key")
        )
        if self.kubectl.is_symlink() or self.kubectl.exists():
            self.kubectl.unlink()
        self.kubectl.symlink_to(self.bin_dir / "kubectl")

    def _ensure_ca(self, name: str, common_name: str) -> tuple[pki.KeyPair, bool]:
        """The CA ``name`` of the state directory, created when missing; and whether it is new."""
        if (self.pki_dir / f"{name}.crt").exists() and (self.pki_dir / f"{name}.key").exists():
            return pki.KeyPair.load(self.pki_dir, name), False
        ca = pki.new_ca(common_name)
        ca.write(self.pki_dir, name)
        return ca, True

    def _missing(self, name: str, reissue: bool) -> bool:
        return reissue or not (self.pki_dir / f"{name}.crt").exists() or not (self.pki_dir / f"{name}.key").exists()

    def _ensure_pki(self) -> None:
        d = self.pki_dir
        ca, new = self._ensure_ca("ca", "gpustack-models-local-ca")
        if self._missing("apiserver", new):
            pki.issue(
                ca,
                "kube-apiserver",
                dns_names=(
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ),
                ip_addresses=("127.0.0.1", SERVICE_IP, self.advertise_address),
                server=True,
            ).write(d, "apiserver")
        for name, (user, groups) in CLIENT_CERTS.items():
            if self._missing(name, new):
                pki.issue(ca, user, organizations=groups, client=True).write(d, name)
        front_proxy_ca, new = self._ensure_ca("front-proxy-ca", "gpustack-models-front-proxy-ca")
        if self._missing("front-proxy-client", new):
            pki.issue(front_proxy_ca, "front-proxy-client", client=True).write(d, "front-proxy-client")
        if not (d / "sa.key").exists() or not (d / "sa.pub").exists():
            pki.new_signing_key(d, "sa")

    def _write_tokens(self) -> None:
        tokens = {user: secrets.token_urlsafe(24) for user in TENANT_USERS}
        lines = [f'{token},{user},uid-{user},"{TENANT_GROUP}"' for user, token in tokens.items()]
        (self.state_dir / "tokens.csv").write_text("\n".join(lines) + "\n")
        (self.state_dir / "tokens.csv").chmod(0o600)
        (self.state_dir / "tokens.json").write_text(json.dumps(tokens, indent=2))
        (self.state_dir / "tokens.json").chmod(0o600)

    def _write_audit_policy(self) -> None:
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                # Whose access a SubjectAccessReview asked about is in its body: tests match the caller.
                {
                    "level": "Request",
                    "resources": [{"group": "authorization.k8s.io", "resources": ["subjectaccessreviews"]}],
                },
                {"level": "Metadata", "resources": [{"group": g} for g in AUDITED_GROUPS]},
                {"level": "None"},
            ],
        }
        (self.state_dir / "audit-policy.yaml").write_text(yaml.safe_dump(policy))

    def _write_admission_config(self) -> None:
        """kube-apiserver presents ``pki/webhook-client.crt`` to every admission webhook ("*")."""
        kubeconfig = self.state_dir / "admission-kubeconfig"
        user = {"client-certificate": str(self.pki_path("webhook-client.crt"))}
        user["client-key"] = str(self.pki_path("webhook-client.key"))
        kubeconfig.write_text(
            yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}]})
        )
        webhook = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig),
        }
        config = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [
                {"name": name, "configuration": webhook}
                for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
            ],
        }
        (self.state_dir / "admission-config.yaml").write_text(yaml.safe_dump(config))

    def write_kubeconfig(self, path: Path, cert: Path, key: Path, user: str = "admin") -> Path:
        """A kubeconfig for this cluster that authenticates with the client certificate ``cert``/``key``."""
        import base64

        def b64(file: Path) -> str:
            return base64.b64encode(file.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.server, "certificate-authority-data": b64(self.pki_path("ca.crt"))},
                }
            ],
            "users": [{"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _write_kubeconfig(self) -> None:
        self.write_kubeconfig(self.kubeconfig, self.pki_path("admin.crt"), self.pki_path("admin.key"))
        # The same cluster with no credentials, for clients that bring a bearer token (--token).
        anonymous = yaml.safe_load(self.kubeconfig.read_text())
        anonymous["users"] = [{"name": "token", "user": {}}]
        anonymous["contexts"] = [{"name": "local", "context": {"cluster": "local", "user": "token"}}]
        self.token_kubeconfig.write_text(yaml.safe_dump(anonymous))

    # --- processes -----------------------------------------------------------------------------------
    def _etcd_args(self) -> list[str]:
        p = self.ports
        return [
            str(self.bin_dir / "etcd"),
            "--name=local",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-cluster=local=http://127.0.0.1:{p.etcd_peer}",
            "--log-level=warn",
            "--quota-backend-bytes=4294967296",
        ]

    def _apiserver_args(self) -> list[str]:
        d, p = self.pki_dir, self.ports
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
            f"--etcd-compaction-interval={self.compaction_interval}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.apiserver}",
            f"--advertise-address={self.advertise_address}",
            "--endpoint-reconciler-type=none",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--cert-dir={self.state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            f"--token-auth-file={self.state_dir / 'tokens.csv'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--requestheader-client-ca-file={d / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-uid-headers=X-Remote-Uid",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={d / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={d / 'front-proxy-client.key'}",
            f"--audit-policy-file={self.state_dir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=2",
            "--profiling=false",
            "--v=1",
            *self._apiserver_node_args(),
        ]

    def _apiserver_node_args(self) -> list[str]:
        """What a real kubelet needs: kubelets authorized the real way (a ``system:node:<name>`` certificate
        in ``system:nodes``, limited to its own Node and Pods), a client certificate towards kubelets, their
        InternalIP dialled rather than their (unresolvable) names, and privileged containers allowed."""
        d = self.pki_dir
        return [
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--admission-control-config-file={self.state_dir / 'admission-config.yaml'}",
            "--allow-privileged=true",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={d / 'kubelet-client.crt'}",
            f"--kubelet-client-key={d / 'kubelet-client.key'}",
            # Kubelets serve with a certificate of the cluster CA (the test suite's does).
            f"--kubelet-certificate-authority={d / 'ca.crt'}",
        ]

    def _scheduler_args(self) -> list[str]:
        return [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={self.scheduler_kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports.scheduler}",
            f"--cert-dir={self.state_dir / 'scheduler-certs'}",
            "--profiling=false",
            "--v=1",
        ]

    def _controller_manager_args(self) -> list[str]:
        d, p = self.pki_dir, self.ports
        return [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            f"--root-ca-file={d / 'ca.crt'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.controller_manager}",
            f"--cert-dir={self.state_dir / 'controller-manager-certs'}",
            "--authentication-skip-lookup=true",
            "--profiling=false",
            "--v=1",
        ]

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
        self._spawn("etcd", self._etcd_args())
        self._wait("etcd", f"http://127.0.0.1:{self.ports.etcd_client}/health", timeout)
        self._start_apiserver(timeout)
        self._spawn("kube-controller-manager", self._controller_manager_args())
        self._spawn("kube-scheduler", self._scheduler_args())
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
        self._spawn("kube-apiserver", self._apiserver_args())
        self._wait("kube-apiserver", f"{self.server}/readyz", timeout)

    def restart_apiserver(self, timeout: float = 180.0) -> None:
        """Stop kube-apiserver alone and start it again on the same etcd."""
        stop_all(self._take(("kube-apiserver",), self._recorded_pids()), time.monotonic() + STOP_SECONDS)
        self._start_apiserver(timeout)

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
