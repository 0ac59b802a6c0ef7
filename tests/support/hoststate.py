"""What a real kubelet and containerd change on the host, recorded before and put back after.

A kubelet sets kernel tunables (``vm.overcommit_memory=1``, ``kernel.panic=10``, ``kernel.panic_on_oops=1``
and a few more), creates cgroups for its Pods, bind-mounts its root directory onto itself (shared) and
mounts volumes under it, and creates ``/var/log/containers`` and ``/var/lib/kubelet/device-plugins``;
containerd mounts snapshots and network namespaces and writes ``/run/containerd``; the bridge CNI plugin
creates its bridge and sets ``net.ipv4.ip_forward=1``. ``record`` returns what a later ``restore`` needs
as plain JSON (so a crashed session's record can be replayed by the next one); ``restore`` is idempotent.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

# Every tunable the kubelet's container manager may change (pkg/kubelet/cm setupKernelTunables), and the
# bridge plugin's forwarding switch.
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
# Host paths the runtime or the kubelet write although their own directories are elsewhere (hard-coded:
# the kubelet's container log symlinks and its device plugin socket, /var/lib/kubelet/device-plugins/
# kubelet.sock, whatever its root directory; containerd 1.6's shim sockets and network namespaces;
# libcni's result cache); removed afterwards only when they did not exist before.
HOST_PATHS = (
    "/var/log/containers",
    "/var/lib/kubelet",
    "/run/containerd",
    "/opt/containerd",
    "/run/netns",
    "/var/lib/cni",
)
CGROUP_FS = Path("/sys/fs/cgroup")
IPTABLES_TABLES = ("filter", "nat", "mangle")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name


def mounts_under(prefixes) -> list[str]:
    """Mount points at or below any of ``prefixes``, deepest (and latest) first."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")
            if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
                found.append(point)
    return sorted(reversed(found), key=lambda p: p.count("/"), reverse=True)


def unmount_under(prefixes, keep=()) -> None:
    """Unmount everything at or below ``prefixes`` (except the mount points in ``keep``); a busy mount
    is detached lazily. Repeats, since one point may carry several stacked mounts."""
    for _ in range(20):
        points = [p for p in mounts_under(prefixes) if p not in keep]
        if not points:
            return
        for point in points:
            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)


def iptables_chains() -> dict[str, list[str]]:
    """The KUBE-* chains of each table (both the kubelet and kube-proxy name theirs so)."""
    chains = {}
    for table in IPTABLES_TABLES:
        out = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True).stdout
        chains[table] = [line[1:].split()[0] for line in out.splitlines() if line.startswith(":KUBE-")]
    return chains


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies: v1 (cpu, memory, pids, ..., named ones such as systemd) and, on a
    hybrid host, the unified v2 one, where the kubelet and runc create each cgroup too."""
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and os.path.ismount(p))


def record(bridge: str, cgroup_root: str) -> dict:
    return {
        "sysctls": {name: _sysctl_path(name).read_text().strip() for name in SYSCTLS if _sysctl_path(name).exists()},
        "paths": {path: os.path.lexists(path) for path in HOST_PATHS},
        "mounts": mounts_under(HOST_PATHS),
        "iptables": iptables_chains(),
        "bridge": bridge,
        "bridgeExisted": Path(f"/sys/class/net/{bridge}").exists(),
        "cgroupRoot": cgroup_root,
        "cgroupRootExisted": any((h / cgroup_root.lstrip("/")).exists() for h in cgroup_hierarchies()),
    }


def _remove_new_iptables_chains(before: dict[str, list[str]]) -> None:
    for table in IPTABLES_TABLES:
        new = set(iptables_chains().get(table, [])) - set(before.get(table, []))
        if not new:
            continue
        out = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True).stdout
        for line in out.splitlines():
            words = shlex.split(line)
            jumps = words[words.index("-j") + 1] if "-j" in words[:-1] else None
            if len(words) > 2 and words[0] == "-A" and words[1] not in new and jumps in new:
                subprocess.run(["iptables", "-t", table, "-D", *words[1:]], capture_output=True)
        for chain in new:
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True)
        for chain in new:
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True)


def cgroup_pids(cgroup_root: str) -> set[int]:
    pids = set()
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / cgroup_root.lstrip("/")
        for procs in top.rglob("cgroup.procs") if top.exists() else ():
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except OSError:
                continue
    return pids


def remove_cgroups(cgroup_root: str, attempts: int = 50) -> None:
    """Kill what still runs in the tree and remove its cgroups, deepest first."""
    for _ in range(attempts):
        for pid in cgroup_pids(cgroup_root):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        left = []
        for hierarchy in cgroup_hierarchies():
            top = hierarchy / cgroup_root.lstrip("/")
            if not top.exists():
                continue
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
                try:
                    directory.rmdir()
                except OSError:
                    left.append(directory)
        if not left:
            return
        time.sleep(0.1)
    raise RuntimeError(f"cgroups left under {cgroup_root}: {left[:5]}")


def restore(before: dict) -> None:
    """Put the host back as ``before`` found it (processes of the node must be stopped already)."""
    if "mounts" in before:
        unmount_under(HOST_PATHS, keep=set(before["mounts"]))
    if not before.get("cgroupRootExisted", True):
        remove_cgroups(before["cgroupRoot"])
    if not before.get("bridgeExisted", True) and Path(f"/sys/class/net/{before['bridge']}").exists():
        subprocess.run(["ip", "link", "delete", before["bridge"]], capture_output=True)
    _remove_new_iptables_chains(before.get("iptables", {}))
    for name, value in before.get("sysctls", {}).items():
        if _sysctl_path(name).read_text().strip() != value:
            _sysctl_path(name).write_text(value)
    for path, existed in before.get("paths", {}).items():
        if not existed and os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.unlink(path)
