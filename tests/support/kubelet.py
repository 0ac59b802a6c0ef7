"""A real Kubernetes node for the tests that ask for one: containerd and a kubelet of the control plane's
own version, as plain processes, registered with the session's control plane.

``real_node`` (session scope, started only when a test requests it) yields a ``RealNode``: the node's
``name``, its kubelet ``root_dir`` (a node plugin registers through ``<root_dir>/plugins_registry/``;
Pods' volumes are under ``<root_dir>/pods``), its ``images`` and helpers.

How it runs on a host like this one (root, cgroup v1, no systemd; measured with kubelet v1.36.5 and
Debian's containerd 1.6.20):

- containerd gets its own root, state, socket, runc root and CNI configuration under the node directory;
  ``restrict_oom_score_adj = true`` is required (without CAP_SYS_RESOURCE every sandbox fails with
  ``runc create failed: ... can't get final child's PID from pipe: EOF``); ``SystemdCgroup = false``.
  Without any CNI configuration the node stays NotReady, even for hostNetwork Pods: a bridge conflist
  on its own test subnet is written.
- The kubelet needs ``failCgroupV1: false`` (it exits at start on cgroup v1 otherwise), ``cgroupDriver:
  cgroupfs`` (containerd 1.6 lacks the RuntimeConfig RPC that would tell it the driver) and
  ``failSwapOn: false``. Its Pods live under their own cgroup root (``CGROUP_ROOT``, created here in
  every hierarchy since the kubelet refuses a root that does not exist), so what the node leaves is
  easy to find. ``makeIPTablesUtilChains: false``: the KUBE-FIREWALL chain (a DROP rule for non-local
  traffic to 127.0.0.0/8) is not created at all. It authenticates kube-apiserver by its client
  certificate and asks kube-apiserver to authorize every request (webhook), as a production kubelet.
  Harmless warnings here: rlimit and oom_score_adj permission denied, cgroup v1 deprecated.
- Host state the two change is recorded before (``tests/support/hoststate.py``) in a host-wide file and
  restored after; one real node runs on a host at a time (a lock), and a session that died without
  cleaning up is cleaned up by the next one from that file.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from gpustack_models.local import pki
from gpustack_models.local.cluster import LocalCluster, free_port
from tests.support import hoststate
from tests.support.images import IMAGES, build_archives
from tests.support.kubernetes import kubectl_run
from tests.support.paths import TEST_STATE
from tests.support.waiting import wait_for

NODE_NAME = "kubelet-node"
# A label and a NoSchedule taint only the real node carries: tests tell it from the Nodes they register
# without a kubelet by the label, and only Pods that tolerate the taint (``RealNode.toleration``) run
# there, so no other test's Pod lands on a node that would really run it.
NODE_LABEL = "gpustack.ai/test-node"
NODE_TAINT = {"key": NODE_LABEL, "value": "kubelet", "effect": "NoSchedule"}
HOST_DIR = Path("/var/tmp/gpustack-models-real-node")  # the host-wide lock and record of what to restore
CGROUP_ROOT = "/gpustack-models-test"
BRIDGE = "gpustack-test0"
POD_SUBNET = "198.18.0.0/24"  # the benchmarking range: nothing else on a host uses it
BRIDGE_ADDRESS = "198.18.0.1"  # the host's address on the bridge: the Pods' gateway
PACKAGES = ("containerd", "runc", "containernetworking-plugins", "busybox-static")


def _die_with_parent():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: stop with the test session, even one killed


def _alive(pid: int, marker: str) -> bool:
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def terminate(pid: int, marker: str, grace: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``grace``, the process ``pid`` if its command line names ``marker``."""
    if not _alive(pid, marker):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid, marker):
        time.sleep(0.1)
    if _alive(pid, marker):
        os.kill(pid, signal.SIGKILL)
    while _alive(pid, marker):
        time.sleep(0.05)


def processes_naming(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid() and _alive(int(entry.name), marker):
            pids.append(int(entry.name))
    return pids


class RealNode:
    def __init__(self, cluster: LocalCluster, directory: Path, image_dir: Path):
        self.cluster = cluster
        self.dir = directory
        self.image_dir = image_dir
        self.name = NODE_NAME
        self.root_dir = directory / "kubelet"
        self.images = dict(IMAGES)
        self.containerd_dir = directory / "containerd"
        self.socket = self.containerd_dir / "containerd.sock"
        self.log_dir = directory / "logs"
        self.kubeconfig = directory / "kubelet.kubeconfig"
        self.port = free_port()
        self.healthz_port = free_port()
        self.pids: dict[str, int] = {}

    # --- helpers for tests --------------------------------------------------------------------------
    def kubectl(self, *args: str, **kwargs):
        return kubectl_run(self.cluster, *args, **kwargs)

    def logs(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A container's output, read by ``kubectl logs`` (kube-apiserver asks the kubelet)."""
        extra = ["-c", container] if container else []
        return self.kubectl("logs", "-n", namespace, pod, *extra).stdout

    toleration = {"key": NODE_TAINT["key"], "operator": "Equal", "value": NODE_TAINT["value"], "effect": "NoSchedule"}

    def pod(self, name: str, command: list[str], image: str = "busybox", **spec) -> dict:
        """A Pod manifest for this node: one container of a local image (never pulled), tolerating the
        node's taint, no ``nodeName`` (the scheduler places it); ``spec`` adds to the Pod's spec."""
        container = {"name": "main", "image": self.images[image], "imagePullPolicy": "Never", "command": command}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [container],
                "tolerations": [self.toleration],
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                **spec,
            },
        }

    def node(self) -> dict:
        return json.loads(self.kubectl("get", "node", self.name, "-o", "json").stdout)

    def is_ready(self) -> bool:
        proc = self.kubectl("get", "node", self.name, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        conditions = json.loads(proc.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def tail_log(self, name: str, lines: int = 40) -> str:
        try:
            return "\n".join((self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- files --------------------------------------------------------------------------------------
    def _write_pki(self) -> None:
        """The kubelet's client certificate (``system:node:<name>`` in ``system:nodes``, so the Node
        authorizer and NodeRestriction apply) and its serving certificate for its node IP, both from the
        cluster CA that kube-apiserver trusts for clients and checks kubelets against."""
        ca = pki.KeyPair.load(self.cluster.pki_dir, "ca")
        directory = self.dir / "pki"
        pki.issue(ca, f"system:node:{self.name}", organizations=("system:nodes",), client=True).write(
            directory, "kubelet-client"
        )
        pki.issue(
            ca, self.name, dns_names=(self.name,), ip_addresses=(self.cluster.advertise_address,), server=True
        ).write(directory, "kubelet-serving")
        self.cluster.write_kubeconfig(
            self.kubeconfig, directory / "kubelet-client.crt", directory / "kubelet-client.key", user=self.name
        )

    def _containerd_config(self) -> str:
        c = self.containerd_dir
        return f"""version = 2
root = "{c / "root"}"
state = "{c / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{c / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images["pause"]}"
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{c / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{c / "net.d"}"
"""

    def _cni_config(self) -> dict:
        return {
            "cniVersion": "1.0.0",
            "name": "gpustack-test",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    # The host reaches its Pods (probes) through the bridge's address, and the Pods reach the
                    # host's own addresses through it as their default route (the relays of
                    # tests/support/relay.py, a plugin serving on the node's address). Nothing is masqueraded
                    # (no iptables rules): no Pod of the tests reaches beyond the host.
                    "isGateway": True,
                    "isDefaultGateway": True,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "dataDir": str(self.containerd_dir / "ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }

    def _kubelet_config(self) -> dict:
        pki_dir = self.dir / "pki"
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": CGROUP_ROOT,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": self.cluster.advertise_address,
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "tlsCertFile": str(pki_dir / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(pki_dir / "kubelet-serving.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.cluster.pki_path("ca.crt"))},
            },
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.dir / "pod-logs"),
            "volumePluginDir": str(self.dir / "volume-plugins"),
            "makeIPTablesUtilChains": False,
            "registerWithTaints": [NODE_TAINT],
            # A shared test machine's disk is not this node's to guard: no eviction, no image GC of the
            # imported images (Pods never pull).
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
        }

    def write_files(self) -> None:
        for sub in (self.log_dir, self.containerd_dir / "net.d", self.root_dir, self.dir / "pod-logs"):
            sub.mkdir(parents=True, exist_ok=True)
        self._write_pki()
        (self.containerd_dir / "config.toml").write_text(self._containerd_config())
        (self.containerd_dir / "net.d" / "10-gpustack-test.conflist").write_text(json.dumps(self._cni_config()))
        (self.dir / "kubelet-config.yaml").write_text(yaml.safe_dump(self._kubelet_config()))

    # --- processes ----------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.pids[name] = proc.pid
        save_record(self.dir, pids=self.pids)
        return proc

    def start_containerd(self, timeout: float = 60.0) -> None:
        proc = self._spawn("containerd", ["containerd", f"--config={self.containerd_dir / 'config.toml'}"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"containerd exited with {proc.returncode}:\n{self.tail_log('containerd')}")
            if self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"containerd did not answer within {timeout:.0f}s:\n{self.tail_log('containerd')}")

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = ["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def import_images(self) -> None:
        for archive in build_archives(self.image_dir).values():
            self.ctr("images", "import", str(archive))

    def start_kubelet(self, timeout: float = 120.0) -> None:
        bin_dir = self.cluster.bin_dir
        proc = self._spawn(
            "kubelet",
            [
                str(bin_dir / "kubelet"),
                f"--config={self.dir / 'kubelet-config.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.root_dir}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.cluster.advertise_address}",
                f"--node-labels={NODE_LABEL}=kubelet",
                "--v=1",
            ],
        )

        def ready():
            if proc.poll() is not None:
                raise RuntimeError(f"kubelet exited with {proc.returncode}:\n{self.tail_log('kubelet')}")
            return self.is_ready()

        try:
            wait_for(ready, timeout=timeout, interval=0.5, message=f"Node {self.name} to be Ready")
        except AssertionError as exc:
            raise RuntimeError(f"{exc}\n{self.tail_log('kubelet')}") from None

    def untaint(self) -> None:
        """Remove the ``node.kubernetes.io/not-ready:NoSchedule`` taint the kubelet registers its Node with.
        The node lifecycle controller would once the Node is Ready; the local control plane does not run
        it, since it would mark every Node the suite registers without a kubelet unreachable and evict
        its Pods. The kubelet sets the taint only when it creates its Node."""
        self.kubectl("taint", "node", self.name, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
        wait_for(
            lambda: self.node()["spec"].get("taints") == [NODE_TAINT], timeout=10, message="only the node's own taint"
        )

    def start(self) -> None:
        t0 = time.monotonic()
        self.write_files()
        self.start_containerd()
        self.import_images()
        self.start_kubelet()
        self.untaint()
        print(f"[real node] {self.name} Ready in {time.monotonic() - t0:.1f}s (logs in {self.log_dir})")


# --- the host-wide record: what to stop and restore, also after a crashed session ----------------------
def _record_file() -> Path:
    return HOST_DIR / "record.json"


def save_record(node_dir: Path, host: dict | None = None, pids: dict | None = None, loopback=None) -> None:
    current = json.loads(_record_file().read_text()) if _record_file().exists() else {}
    current["dir"] = str(node_dir)
    for key, value in (("host", host), ("pids", pids), ("loopback", loopback)):
        if value is not None:
            current[key] = value
    tmp = _record_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(current, indent=2))
    tmp.replace(_record_file())


def record_loopback(address: str) -> None:
    """Note an address about to be added to the host's ``lo`` (a relay's ClusterIP), for ``clean_up``."""
    current = json.loads(_record_file().read_text())
    save_record(Path(current["dir"]), loopback=sorted({*current.get("loopback", []), address}))


def forget_loopback(address: str) -> None:
    """Remove an address from ``lo`` and from the record."""
    subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], capture_output=True, check=False)
    current = json.loads(_record_file().read_text())
    save_record(Path(current["dir"]), loopback=[a for a in current.get("loopback", []) if a != address])


def clean_up(record: dict, record_file: Path | None = None) -> None:
    """Stop the node a record describes and put the host back: the kubelet first (it would restart what
    is stopped), then the Pods' processes and containerd's shims, containerd, then mounts, cgroups and
    the rest of the host state. Then forget the record (``record_file``, the host-wide one by default)."""
    node_dir = record["dir"]
    pids = record.get("pids", {})
    if "kubelet" in pids:
        terminate(pids["kubelet"], node_dir)
    for pid in hoststate.cgroup_pids(record["host"]["cgroupRoot"]) if "host" in record else ():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in processes_naming(str(Path(node_dir) / "containerd" / "containerd.sock")):
        terminate(pid, node_dir, grace=5)  # containerd-shim-runc-v2 -address <socket>
    if "containerd" in pids:
        terminate(pids["containerd"], node_dir)
    hoststate.unmount_under([node_dir])
    for address in record.get("loopback", ()):  # relays' ClusterIPs (tests/support/relay.py)
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], capture_output=True, check=False)
    if "host" in record:
        hoststate.restore(record["host"])
    (record_file or _record_file()).unlink(missing_ok=True)


class HostLock:
    """One real node per host at a time: a lock on a file, released when its holder exits however."""

    def __init__(self, timeout: float = 1800.0):
        self.timeout = timeout
        self.fh = None

    def __enter__(self):
        HOST_DIR.mkdir(parents=True, exist_ok=True)
        self.fh = open(HOST_DIR / "lock", "w")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError("another test session keeps its real node running") from None
                time.sleep(1)

    def __exit__(self, *exc):
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def _make_cgroup_root() -> None:
    """The kubelet's cgroup root, in every hierarchy; cpuset's needs its parent's CPUs and memory nodes."""
    for hierarchy in hoststate.cgroup_hierarchies():
        directory = hierarchy / CGROUP_ROOT.lstrip("/")
        directory.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (directory / name).exists() and not (directory / name).read_text().strip():
                (directory / name).write_text((hierarchy / name).read_text())


def check_host(bin_dir: Path) -> None:
    missing = [p for p in ("containerd", "runc", "ctr", "gcc") if shutil.which(p) is None]
    if missing or not Path("/usr/lib/cni/bridge").exists():
        raise RuntimeError(f"the real node needs Debian's {' '.join(PACKAGES)} (run the suite with make test)")
    if os.geteuid() != 0:
        raise RuntimeError("the real node needs root (containerd and the kubelet)")
    if not (bin_dir / "kubelet").exists():
        raise RuntimeError(f"no kubelet in {bin_dir}: deploy/controlplane/build.sh builds it")


@pytest.fixture(scope="session")
def real_node(cluster, tmp_path_factory):
    """A Ready Node run by a real kubelet and containerd, for the whole session."""
    check_host(cluster.bin_dir)
    directory = TEST_STATE / "node"
    with HostLock():
        if _record_file().exists():
            print("[real node] cleaning up after an earlier session that did not")
            clean_up(json.loads(_record_file().read_text()))
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        save_record(directory, host=hoststate.record(BRIDGE, CGROUP_ROOT))
        _make_cgroup_root()
        node = RealNode(cluster, directory, tmp_path_factory.mktemp("node-images"))
        try:
            node.start()
            yield node
        finally:
            clean_up(json.loads(_record_file().read_text()))
            node.kubectl("delete", "node", node.name, "--ignore-not-found", "--wait=false", check=False)
