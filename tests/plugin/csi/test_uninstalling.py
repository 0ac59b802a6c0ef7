"""The mounter (``--role mounter``, a real process) stopped while a Pod still mounts a model: marked as
uninstalling in its Pod's annotations (the downwardAPI file), it keeps its CSI socket answering until the
kubelet's NodeUnpublish, then exits (deleting the node's cache if asked); unmarked (a rolling update), it exits
at once and the mount stays for its successor. No API runs and its CA file is gone, as after an uninstall: the
unpublish's release is only remembered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import grpc
import pytest

from gpustack_models.plugin.csi.bind_mounts import Mounted, MountTable, mount_points
from gpustack_models.plugin.csi.generated import csi_pb2, csi_pb2_grpc
from gpustack_models.plugin.csi.shared_files import SharedEngine
from tests.support.paths import REPO
from tests.support.waiting import wait_for

DIGEST = "sha256:" + "ab" * 32
UID = "0b3f6f0e-7a51-4e6f-9d1e-6a1c5e0f0c11"
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


class Node:
    """A node's directories with one published volume: the tree bind-mounted on a Pod's target."""

    def __init__(self, root):
        self.root = root
        self.cache, self.mounts = root / "cache", root / "mounts"
        self.kubelet = root / "kubelet"
        self.target = self.kubelet / "pods" / UID / "volumes" / "kubernetes.io~csi" / "model" / "mount"
        self.socket = root / "csi.sock"
        self.annotations = root / "annotations"
        engine = SharedEngine(str(self.cache), str(self.mounts))
        tree = engine.cache.tree(DIGEST)
        tree.mkdir(parents=True)
        (tree / "config.json").write_text("{}")
        self.target.mkdir(parents=True)
        subprocess.run(["mount", "--bind", str(tree), str(self.target)], check=True)
        table = MountTable(str(self.mounts), engine.cache.tree)
        table.add(Mounted("vol-1", str(self.target), DIGEST, "art", "team", "consumer", UID))
        (root / "kubeconfig").write_text(KUBECONFIG)
        self.state = root / "plugin" / "n1" / "serving-tls"  # the node role's state
        self.state.mkdir(parents=True)
        (self.state / "tls.crt").write_text("x")
        self.lines: list[str] = []

    def mounted(self) -> bool:
        return str(self.target) in mount_points()

    def start(self) -> subprocess.Popen:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.root / "kubeconfig"),
            "GPUSTACK_DATA_DIR": str(self.root),
            "GPUSTACK_API_URL": "https://127.0.0.1:9",
            "GPUSTACK_PLUGIN_CACHE_DIR": str(self.cache),
            "GPUSTACK_PLUGIN_MOUNTS_DIR": str(self.mounts),
            "GPUSTACK_PLUGIN_KUBELET_DIR": str(self.kubelet),
            "GPUSTACK_PLUGIN_CSI_SOCKET": str(self.socket),
            "GPUSTACK_PLUGIN_POD_ANNOTATIONS_FILE": str(self.annotations),
            "GPUSTACK_PLUGIN_PURGE_ON_UNINSTALL": "true",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpustack_models.plugin", "--role", "mounter", "--node", "n1"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        threading.Thread(target=lambda: self.lines.extend(proc.stderr), daemon=True).start()
        wait_for(self.probe, timeout=30, message="the CSI socket answering")
        return proc

    def said(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def node_service(self):
        channel = grpc.insecure_channel(f"unix://{self.socket}")
        return channel, csi_pb2_grpc.NodeStub(channel)

    def probe(self) -> bool:
        channel = grpc.insecure_channel(f"unix://{self.socket}")
        try:
            csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=2)
            return True
        except grpc.RpcError:
            return False
        finally:
            channel.close()

    def unpublish(self) -> None:
        channel, node = self.node_service()
        with channel:
            node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-1", target_path=str(self.target)), timeout=10
            )


@pytest.fixture
def node(tmp_path):
    node = Node(tmp_path)
    yield node
    if node.mounted():
        subprocess.run(["umount", str(node.target)], check=False)


def test_a_marked_mounter_serves_until_the_last_unpublish_then_purges_and_exits(node):
    node.annotations.write_text(
        'kubernetes.io/config.seen="2026-12-02T00:00:00Z"\nworker.gpustack.ai/uninstalling="true"\n'
    )
    proc = node.start()
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: node.said("uninstalling: serving NodeUnpublish until no publication is left (1 now)"),
             message="the mounter draining")  # fmt: skip
    assert proc.poll() is None and node.probe(), "the CSI socket answers while a publication remains"
    node.unpublish()
    assert proc.wait(timeout=30) == 0, "".join(node.lines)
    assert not node.mounted() and not node.target.exists()
    assert node.said("uninstalling: no publication left")
    assert list(node.cache.iterdir()) == [], "the cache is purged"
    assert list((node.root / "plugin").iterdir()) == [], "and the plugin's state"


def test_an_unmarked_mounter_exits_at_once_and_leaves_the_mount(node):
    node.annotations.write_text('kubernetes.io/config.seen="2026-12-02T00:00:00Z"\n')
    proc = node.start()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0, "".join(node.lines)
    assert node.mounted(), "the mount stays for the next mounter (a rolling update)"
    assert not node.said("uninstalling")
    assert (node.cache / "models").is_dir() and node.state.is_dir()
