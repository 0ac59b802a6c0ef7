"""The node plugin's CSI driver ``model.csi.gpustack.ai``, driven as the kubelet drives it: gRPC over the
real ``gpustack_models.plugin`` process's unix socket, the worker authorizing each mount, real read-only bind mounts.

Tests of a mount (``test_it_mounts_*``, ``test_it_answers_unavailable_*``, ``test_it_maps_*``,
``test_it_keeps_*_across_a_restart``) need the worker's ``/internal/v1/mounts`` endpoint."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import pytest

from gpustack_models.kinds import GROUP
from gpustack_models.plugin.csi.generated import (
    csi_pb2,
    csi_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from tests.support import REPO, TEST_STATE, wait_for
from tests.support.csi_calls import POD_UID, POD_UID_KEY, Mode, pod_context, publish_request
from tests.support.pods import model_pod, model_volume, volume_handle
from tests.support.stores import epoch
from tests.test_plugins import STORAGE, big_files


class Kubelet:
    """What the kubelet does with the plugin's CSI socket."""

    def __init__(self, plugin):
        self.plugin = plugin
        self.channel = grpc.insecure_channel(f"unix:{plugin.csi_socket}")
        self.node = csi_pb2_grpc.NodeStub(self.channel)
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)

    def publish(self, volume_id, target, context, *, readonly=True, mode=Mode.SINGLE_NODE_WRITER, block=False):
        request = publish_request(volume_id, target, context, readonly=readonly, mode=mode, block=block)
        return self.node.NodePublishVolume(request, timeout=60)

    def unpublish(self, volume_id, target):
        request = csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target))
        return self.node.NodeUnpublishVolume(request, timeout=60)

    def refusal(self, call, *args, **kwargs) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            call(*args, **kwargs)
        return info.value


def is_mount_point(path) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)


def tree_bytes(root) -> dict[str, bytes]:
    root = Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def targets(tmp_path):
    """A pods directory as the kubelet lays it out; every mount left under it is undone afterwards."""
    pods = tmp_path / "kubelet" / "pods"
    pods.mkdir(parents=True)
    yield pods
    for path in sorted(pods.rglob("*"), key=lambda p: -len(p.parts)):
        if is_mount_point(path):
            subprocess.run(["umount", "-l", str(path)], check=False)


def target_in(pods: Path, pod_uid=POD_UID, volume="model") -> Path:
    parent = pods / pod_uid / "volumes" / "kubernetes.io~csi" / volume
    parent.mkdir(parents=True, exist_ok=True)
    return parent / "mount"


def make_pod(core, namespace, node, name="consumer", volumes=None):
    """A Pod bound to ``node`` with ``volumes`` (default: one ``model`` volume of ``art``); its uid."""
    return core.create_namespaced_pod(namespace, model_pod(name, node, volumes, image="busybox")).metadata.uid


# --- without the worker: the driver's own answers ------------------------------------------------------


def test_it_passes_csi_sanity_for_the_identity_and_node_services(scenario, tmp_path):
    (plugin,) = scenario.plugins(1)
    binary = subprocess.run([str(REPO / "deploy/csi-sanity/build.sh")], capture_output=True, text=True, check=True)
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            binary.stdout.strip().splitlines()[-1],
            f"--csi.endpoint={plugin.csi_socket}",
            f"--csi.mountdir={tmp_path / 'mount'}",
            f"--csi.stagingdir={tmp_path / 'staging'}",
            "--ginkgo.focus=Identity Service|Node Service",
            # It creates its volume with the Controller service's CreateVolume, which this driver has not.
            "--ginkgo.skip=should remove target path",
            f"--ginkgo.json-report={report}",
            "--ginkgo.no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    specs = [s for suite in json.loads(report.read_text()) for s in suite["SpecReports"]]
    ran = [s for s in specs if s["State"] == "passed"]
    failed = [s for s in specs if s["State"] not in ("passed", "skipped", "pending")]
    assert failed == [] and len(ran) >= 10, [s["LeafNodeText"] for s in failed]
    names = {" ".join(s["ContainerHierarchyTexts"] + [s["LeafNodeText"]]) for s in ran}
    assert any("NodeGetInfo" in n for n in names) and any("GetPluginInfo" in n for n in names)


def test_it_identifies_itself_and_registers_with_the_kubelet(scenario):
    registry = Path(tempfile.mkdtemp(prefix="registry-"))  # short: a socket's path has at most 107 bytes
    stale = registry / "model.csi.gpustack.ai-reg.sock"
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))  # a socket left by an earlier run: nothing listens on it
    leftover.close()
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_REGISTRATION_DIR=registry)
    kubelet = Kubelet(plugin)
    info = kubelet.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=10)
    assert info.name == "model.csi.gpustack.ai" and info.vendor_version
    assert list(kubelet.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest()).capabilities) == []
    assert kubelet.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id == plugin.node
    assert list(kubelet.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest()).capabilities) == []
    stage = kubelet.refusal(kubelet.node.NodeStageVolume, csi_pb2.NodeStageVolumeRequest())
    assert stage.code() == grpc.StatusCode.UNIMPLEMENTED
    registration = pluginregistration_pb2_grpc.RegistrationStub(grpc.insecure_channel(f"unix:{stale}"))
    got = registration.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10)
    assert (got.type, got.name, got.endpoint) == ("CSIPlugin", "model.csi.gpustack.ai", str(plugin.csi_socket))
    assert list(got.supported_versions) == ["1.0.0"]
    status = pluginregistration_pb2.RegistrationStatus(plugin_registered=False, error="test: refused")
    registration.NotifyRegistrationStatus(status, timeout=10)
    plugin.stop()
    assert not stale.exists(), "the registration socket outlived the plugin: the kubelet would keep the driver"
    log = (TEST_STATE / f"plugin-{plugin.node}.log").read_text()
    assert "REFUSED TO REGISTER" in log and "test: refused" in log


def test_it_refuses_incomplete_or_writable_requests_without_mounting(scenario, namespace, targets):
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_KUBELET_DIR=targets.parent)
    kubelet = Kubelet(plugin)
    target = target_in(targets)
    cases = {
        "pod info": pod_context(namespace, name=""),
        "artifact": pod_context(namespace, artifact=None),
        "ephemeral": {k: v for k, v in pod_context(namespace).items() if not k.endswith("ephemeral")},
        "a typo": pod_context(namespace, artefact="art"),
        "a bad uid": pod_context(namespace, uid="../../etc"),
        "a bad digest": pod_context(namespace, expectedDigest="sha256:abc"),
    }
    for what, context in cases.items():
        error = kubelet.refusal(kubelet.publish, "vol-1", target, context)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, error.details())
    missing = kubelet.refusal(kubelet.publish, "vol-1", target, pod_context(namespace, name=""))
    assert "csi.storage.k8s.io/pod.name" in missing.details()
    assert "artifact is required" in kubelet.refusal(kubelet.publish, "v", target, cases["artifact"]).details()
    writable = kubelet.refusal(kubelet.publish, "vol-1", target, pod_context(namespace), readonly=False)
    assert writable.code() == grpc.StatusCode.INVALID_ARGUMENT and "readOnly: true" in writable.details()
    for mode in (Mode.MULTI_NODE_MULTI_WRITER, Mode.MULTI_NODE_SINGLE_WRITER, Mode.UNKNOWN):
        error = kubelet.refusal(kubelet.publish, "vol-1", target, pod_context(namespace), mode=mode)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    block = kubelet.refusal(kubelet.publish, "vol-1", target, pod_context(namespace), block=True)
    assert block.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not target.exists() and not is_mount_point(target)


def test_it_refuses_hostile_target_paths_and_volume_ids(scenario, namespace, targets, tmp_path):
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_KUBELET_DIR=targets.parent)
    kubelet = Kubelet(plugin)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("mine")
    escape = targets / "evil"
    escape.symlink_to(tmp_path)  # under pods/, but leading out of it
    neighbour = target_in(targets, pod_uid=str(uuid.uuid4())).parent  # another Pod's volume directory
    sideways = targets / POD_UID / "volumes" / "kubernetes.io~csi" / "linked"
    sideways.parent.mkdir(parents=True)
    sideways.symlink_to(neighbour)  # a link that stays under pods/, to another Pod's volume
    hostile = [
        precious,  # outside the kubelet's pods directory
        targets / ".." / ".." / "precious",  # climbs out with ..
        targets / "x" / ".." / ".." / "kubelet",
        escape / "precious",  # a symbolic link out of pods/
        sideways / "mount",  # a symbolic link within pods/: never followed either
        "relative/path",
        str(targets) + "//double",
        targets,  # pods/ itself
        "/",
    ]
    for path in hostile:
        for error in (
            kubelet.refusal(kubelet.publish, "vol-1", path, pod_context(namespace)),
            kubelet.refusal(kubelet.unpublish, "vol-1", path),
        ):
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, error.details())
    assert (precious / "keep").read_text() == "mine" and not is_mount_point(precious)
    assert not (neighbour / "mount").exists()
    for volume_id in ("", "x" * 129, "vol\n1", "vol\x001"):
        error = kubelet.refusal(kubelet.publish, volume_id, target_in(targets), pod_context(namespace))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, repr(volume_id)
    # A non-empty directory that is not a volume of this driver is never mounted over nor removed.
    occupied = target_in(targets, volume="occupied")
    occupied.mkdir()
    (occupied / "data").write_text("kept")
    error = kubelet.refusal(kubelet.unpublish, "vol-1", occupied)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (occupied / "data").read_text() == "kept"


# --- with the worker's mount endpoint -------------------------------------------------------------------


def test_it_mounts_a_ready_model_read_only_and_unmounts_it(scenario, core, namespace, targets):
    scenario.artifact()
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_KUBELET_DIR=targets.parent)
    scenario.prefetch([plugin])
    ready = scenario.wait_state(plugin.node, "Ready")
    volumes = [model_volume("model", "art", scenario.digest), model_volume("spare", "art", scenario.digest)]
    uid = make_pod(core, namespace, plugin.node, volumes=volumes)
    kubelet = Kubelet(plugin)
    target = target_in(targets, uid)
    context = pod_context(namespace, uid=uid, expectedDigest=scenario.digest)
    volume_id = volume_handle(uid, "model")
    # lastUsedTime has whole seconds: a use from the next second on is a later one.
    wait_for(lambda: time.time() >= epoch(ready["lastUsedTime"]) + 1, timeout=5, interval=0.05,
             message="a second past the last use")  # fmt: skip
    kubelet.publish(volume_id, target, context)
    assert is_mount_point(target)
    assert tree_bytes(target) == {k: v for k, v in scenario.files.items()}
    with pytest.raises(OSError) as info:
        (target / "config.json").write_text("changed")
    assert info.value.errno == errno.EROFS
    kubelet.publish(volume_id, target, context)  # again: the same answer
    other = kubelet.refusal(kubelet.publish, volume_handle(uid, "spare"), target, context)
    assert other.code() == grpc.StatusCode.ALREADY_EXISTS
    wait_for(
        lambda: scenario.entry(plugin.node).get("lastUsedTime", "") > ready["lastUsedTime"],
        timeout=15,
        message="the mount to count as a use in the store's status",
    )
    kubelet.unpublish(volume_id, target)
    assert not target.exists() and not is_mount_point(target)
    kubelet.unpublish(volume_id, target)  # again: nothing there is fine
    assert scenario.tree(plugin).is_dir(), "unmounting removed the cached tree"


def test_it_answers_unavailable_with_the_progress_until_the_model_is_ready(scenario, hub, core, namespace, targets):
    scenario.artifact(files=big_files(scenario.repo, mb=6))
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_KUBELET_DIR=targets.parent)
    uid = make_pod(core, namespace, plugin.node)
    kubelet = Kubelet(plugin)
    target = target_in(targets, uid)
    hub.faults.throttle(scenario.weights, 600_000)  # about 10 s: slow enough to see it downloading
    messages = []

    def downloading():
        try:
            kubelet.publish(volume_handle(uid, "model"), target, pod_context(namespace, uid=uid))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
            messages.append(error.details())
            return "is downloading on this node:" in error.details() and " % (" in error.details()
        return False

    wait_for(downloading, timeout=60, interval=0.5, message="a publish answering the download's progress")
    assert messages[0].startswith("model art ") and not is_mount_point(target)
    hub.faults.clear()
    scenario.wait_state(plugin.node, "Ready", timeout=90)
    kubelet.publish(volume_handle(uid, "model"), target, pod_context(namespace, uid=uid))
    assert is_mount_point(target) and (target / "config.json").read_bytes() == scenario.files["config.json"]
    kubelet.unpublish(volume_handle(uid, "model"), target)


def test_it_maps_the_workers_refusals(scenario, core, namespace, targets):
    scenario.artifact()
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_KUBELET_DIR=targets.parent)
    (elsewhere,) = scenario.plugins(1)
    zeros = "sha256:" + "0" * 64
    volumes = [
        model_volume("model", "art"),
        model_volume("missing", "missing"),
        model_volume("zeros", "art", zeros),
        model_volume("unresolved", "unresolved"),
    ]
    uid = make_pod(core, namespace, plugin.node, volumes=volumes)
    away = make_pod(core, namespace, elsewhere.node, name="away")
    kubelet = Kubelet(plugin)
    target = target_in(targets, uid)
    cases = [
        (pod_context(namespace, uid=uid, artifact="missing"), "missing", grpc.StatusCode.NOT_FOUND),
        (pod_context(namespace, uid=str(uuid.uuid4())), "model", grpc.StatusCode.NOT_FOUND),  # another uid
        (pod_context(namespace, name="away", uid=away), "model", grpc.StatusCode.PERMISSION_DENIED),  # elsewhere
        (pod_context(namespace, uid=uid, expectedDigest=zeros), "zeros", grpc.StatusCode.INVALID_ARGUMENT),
        (pod_context(namespace, uid=uid, artifact="unresolved"), "unresolved", grpc.StatusCode.FAILED_PRECONDITION),
        (pod_context(namespace, uid=uid, artifact="missing"), "model", grpc.StatusCode.PERMISSION_DENIED),  # not asked
    ]
    scenario.kube.create(
        f"{STORAGE}/namespaces/{namespace}/modelartifacts",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": "unresolved"},
            "spec": {"source": {"huggingFace": {"repository": f"org/absent-{uuid.uuid4().hex[:6]}"}}},
        },
    )
    for context, volume, code in cases:
        error = kubelet.refusal(kubelet.publish, volume_handle(context[POD_UID_KEY], volume), target, context)
        assert error.code() == code, (context, error.details())
        assert error.details(), "a refusal without the worker's message"
    assert not is_mount_point(target)


def test_it_keeps_mounts_and_their_models_across_a_restart(scenario, hub, core, namespace, targets):
    """A mounted model outlives a restart of the plugin whose prefetch is gone meanwhile; a model nothing
    mounts, its prefetch deleted at the same time, is removed by the restarted plugin (removal delay 0)."""
    other_repo = f"org/spare-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(other_repo, {"config.json": other_repo.encode(), "model.safetensors": b"s" * 4096})
    mounted = scenario.artifact()
    spare = scenario.artifact("spare", repo=other_repo)
    scenario.digest = mounted  # the scenario's entry and tree: the mounted model's
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_KUBELET_DIR=targets.parent, GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS=0)
    scenario.prefetch([plugin])
    scenario.prefetch([plugin], name="spare", artifact="spare")
    scenario.wait_state(plugin.node, "Ready")
    spare_tree = plugin.cache / "models" / spare.split(":", 1)[1]
    wait_for(spare_tree.is_dir, timeout=90, message="the spare model published")
    uid = make_pod(core, namespace, plugin.node)
    target = target_in(targets, uid)
    volume_id = volume_handle(uid, "model")
    Kubelet(plugin).publish(volume_id, target, pod_context(namespace, uid=uid))
    scenario.kube.delete(f"{STORAGE}/namespaces/{namespace}/modelprefetches/spare")  # its grace: 8 s
    plugin.stop()
    assert spare_tree.is_dir(), "the plugin stopped removed the spare model: only the restarted one may"
    assert is_mount_point(target), "stopping the plugin unmounted a Pod's model"
    scenario.kube.delete(f"{STORAGE}/namespaces/{namespace}/modelprefetches/warm")
    plugin.start()
    kubelet = Kubelet(plugin)
    kubelet.publish(volume_id, target, pod_context(namespace, uid=uid))  # known again: the same volume
    assert (target / "config.json").read_bytes() == scenario.files["config.json"]
    wait_for(lambda: scenario.entry(plugin.node) is not None, timeout=30, message="the restarted plugin's status")
    # The restarted plugin's collection removes what left spec.models, and not the mounted model.
    wait_for(lambda: not spare_tree.exists(), timeout=60, message="the restarted plugin to remove the spare model")
    assert scenario.tree(plugin).is_dir(), "a mounted model was removed"
    kubelet.unpublish(volume_id, target)
    assert not is_mount_point(target)


def test_it_mounts_with_the_mounter_apart_from_the_node_role(scenario, hub, core, namespace, targets, tmp_path):
    """The plugin's Pod split: ``--role mounter`` serves the CSI driver, ``--role node`` downloads. The
    kubelet's message shows the node role's progress; the node role holds and counts as used what the
    mounter mounted, told through the mounts directory."""
    scenario.artifact(files=big_files(scenario.repo, mb=6))
    mounts = tmp_path / "mounts"
    (plugin,) = scenario.plugins(
        1, GPUSTACK_PLUGIN_KUBELET_DIR=targets.parent, GPUSTACK_PLUGIN_MOUNTS_DIR=mounts, split=True
    )
    uid = make_pod(core, namespace, plugin.node)
    kubelet = Kubelet(plugin)
    target = target_in(targets, uid)
    volume_id = volume_handle(uid, "model")
    hub.faults.throttle(scenario.weights, 600_000)
    messages = []

    def downloading():
        try:
            kubelet.publish(volume_id, target, pod_context(namespace, uid=uid))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
            messages.append(error.details())
            return "is downloading on this node:" in error.details() and " % (" in error.details()
        return False

    wait_for(downloading, timeout=60, interval=0.5, message="the mounter answering the node role's progress")
    hub.faults.clear()
    ready = scenario.wait_state(plugin.node, "Ready", timeout=90)
    wait_for(lambda: time.time() >= epoch(ready["lastUsedTime"]) + 1, timeout=5, interval=0.05,
             message="a second past the last use")  # fmt: skip
    kubelet.publish(volume_id, target, pod_context(namespace, uid=uid))
    assert is_mount_point(target) and (target / "config.json").read_bytes() == scenario.files["config.json"]
    assert json.loads((mounts / "mounted-digests").read_text()) == [scenario.digest]
    assert len(list(mounts.glob("*.json"))) == 1 and not (plugin.cache / "mounts").exists()
    wait_for(
        lambda: scenario.entry(plugin.node).get("lastUsedTime", "") > ready["lastUsedTime"],
        timeout=15,
        message="the node role to count the mount as a use",
    )
    kubelet.unpublish(volume_id, target)
    assert not is_mount_point(target)
    assert json.loads((mounts / "mounted-digests").read_text()) == []
