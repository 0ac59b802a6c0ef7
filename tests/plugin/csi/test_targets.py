"""The CSI driver's target paths swapped for symbolic links between its checks and its mount: the mount
lands on the directory it checked or nowhere, never on the link's destination.

The driver runs in the test process on a real engine whose model was downloaded from the fake hub;
the API's answer (which digest the Pod may mount) is given by a stand-in, the worker's part being
covered by ``tests/test_csi.py``. The swap is made at a fixed point, deterministically: when the driver
records the volume, after it checked the target and before it mounts."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gpustack_models.plugin.csi import beneath
from gpustack_models.plugin.csi.bind_mounts import mount_points
from gpustack_models.plugin.csi.driver import Driver
from gpustack_models.plugin.csi.generated import csi_pb2
from gpustack_models.plugin.csi.mount_client import MountGrant
from gpustack_models.plugin.csi.shared_files import ENTRIES, SharedEngine
from gpustack_models.plugin.csi.validation import CsiError
from tests.plugin.conftest import ticket_for

UID = "0b3f6f0e-7a51-4e6f-9d1e-6a1c5e0f0c11"
OTHER_UID = "7c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"


class Grants:
    """The API's side: every mount is granted, for the digest the test downloaded."""

    def __init__(self, digest: str):
        self.digest = digest

    def mount(self, volume_id, pod, artifact, expected_digest) -> MountGrant:
        return MountGrant(self.digest, artifact, pod.namespace, 0)

    def release(self, volume_id) -> None:
        pass


def publish_request(target) -> csi_pb2.NodePublishVolumeRequest:
    cap = csi_pb2.VolumeCapability(access_mode=csi_pb2.VolumeCapability.AccessMode(mode=1))
    cap.mount.SetInParent()
    context = {
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/pod.namespace": "team",
        "csi.storage.k8s.io/pod.name": "consumer",
        "csi.storage.k8s.io/pod.uid": UID,
        "artifact": "art",
    }
    return csi_pb2.NodePublishVolumeRequest(
        volume_id="vol-1", target_path=str(target), volume_capability=cap, readonly=True, volume_context=context
    )


@pytest.fixture
def kubelet(tmp_path):
    """A kubelet's root with two Pods' volume directories; every mount left under it is undone after."""
    root = tmp_path / "kubelet"
    for uid in (UID, OTHER_UID):
        (root / "pods" / uid / "volumes" / "kubernetes.io~csi" / "model").mkdir(parents=True)
    yield root
    for point in sorted(mount_points(), key=len, reverse=True):
        if point.startswith(str(tmp_path) + os.sep):
            subprocess.run(["umount", "-l", point], check=False)


@pytest.fixture(params=["new mount API", "openat2 and mount(2) missing"])
def driver(request, fakehub, make_engine, kubelet, monkeypatch):
    """The driver; on this kernel, or as on one without ``openat2`` and the new mount API (the fallbacks)."""
    if request.param != "new mount API":
        monkeypatch.setattr(beneath, "_missing", {"openat2", "open_tree", "mount_setattr", "move_mount"})
    commit = fakehub.add_hf_repo("org/tiny", {"config.json": b'{"tiny": true}', "model.safetensors": b"w" * 4096})
    ticket = ticket_for(fakehub, "org/tiny", commit)
    engine = make_engine()
    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).state == "Ready"
    return Driver(engine, "node-a", Grants(ticket.digest), str(kubelet))


def swap_when_recorded(driver: Driver, swap) -> None:
    """Run ``swap`` when the driver records the volume: after its checks, before its mount."""
    add = driver.table.add

    def recorded(mounted):
        add(mounted)
        swap()

    driver.table.add = recorded


def shows_model(path) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def test_a_target_swapped_for_a_symbolic_link_is_never_followed_by_the_mount(driver, kubelet, tmp_path):
    elsewhere = tmp_path / "elsewhere"  # outside the kubelet's pods directory
    elsewhere.mkdir()
    volume = kubelet / "pods" / UID / "volumes" / "kubernetes.io~csi" / "model"
    target = volume / "mount"

    def swap():
        os.rename(target, volume / "moved")
        os.symlink(elsewhere, target)

    swap_when_recorded(driver, swap)
    try:
        driver.publish(publish_request(target))
    except CsiError:
        pass  # refusing is fine; mounting on the link's destination is not
    assert str(elsewhere) not in mount_points() and not shows_model(elsewhere)


def test_a_parent_swapped_for_a_symbolic_link_is_never_followed_by_the_mount(driver, kubelet, tmp_path):
    pods = kubelet / "pods"
    other = pods / OTHER_UID / "volumes" / "kubernetes.io~csi" / "model"  # another Pod's volume
    volume = pods / UID / "volumes" / "kubernetes.io~csi" / "model"
    os.mkdir(other / "mount")

    def swap():
        os.rename(volume, volume.parent / "moved")
        os.symlink(other, volume)

    swap_when_recorded(driver, swap)
    try:
        driver.publish(publish_request(volume / "mount"))
    except CsiError:
        pass
    assert str(other / "mount") not in mount_points() and not shows_model(other / "mount")


def test_a_parent_that_is_a_symbolic_link_is_refused_and_nothing_is_mounted(driver, kubelet):
    pods = kubelet / "pods"
    other = pods / OTHER_UID / "volumes" / "kubernetes.io~csi" / "model"  # under pods/, another Pod's
    volume = pods / UID / "volumes" / "kubernetes.io~csi" / "model"
    os.rmdir(volume)
    os.symlink(other, volume)
    with pytest.raises(CsiError) as info:
        driver.publish(publish_request(volume / "mount"))
    assert info.value.code.name == "INVALID_ARGUMENT", info.value.message
    assert "symbolic link" in info.value.message
    assert not (other / "mount").exists() and not any(p.startswith(str(pods)) for p in mount_points())


def test_it_mounts_read_only_and_unmounts_through_the_directories_it_opened(driver, kubelet):
    target = kubelet / "pods" / UID / "volumes" / "kubernetes.io~csi" / "model" / "mount"
    driver.publish(publish_request(target))
    assert mount_points()[str(target)][0] == "ro" and shows_model(target)
    with pytest.raises(OSError):
        (target / "config.json").write_text("changed")
    unpublish = csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-1", target_path=str(target))
    driver.unpublish(unpublish)
    assert str(target) not in mount_points() and not target.exists()
    driver.unpublish(unpublish)  # again: nothing there is fine


def test_the_mounter_never_mounts_a_published_tree_the_node_role_replaced_by_a_link(kubelet, tmp_path):
    """The non-root node role writes the cache: a tree it made a symbolic link (to a directory of the host)
    is not Ready for the mounter, and is never opened through the link."""
    secret = tmp_path / "host-secret"
    secret.mkdir()
    (secret / "config.json").write_text("not a model")
    cache = tmp_path / "cache"
    digest = "sha256:" + "ab" * 32
    (cache / "models").mkdir(parents=True)
    (cache / "models" / ("ab" * 32)).symlink_to(secret)
    engine = SharedEngine(cache, tmp_path / "mounts")
    driver = Driver(engine, "node-a", Grants(digest), str(kubelet), mounts_dir=str(tmp_path / "mounts"))
    target = kubelet / "pods" / UID / "volumes" / "kubernetes.io~csi" / "model" / "mount"
    with pytest.raises(CsiError) as info:
        driver.publish(publish_request(target))
    assert info.value.code.name == "UNAVAILABLE", info.value.message
    with pytest.raises(OSError):
        driver.open_tree(digest)
    assert str(target) not in mount_points() and not shows_model(target)


def test_the_mounter_reads_the_node_roles_progress_checked_and_never_through_a_link(tmp_path):
    cache, digest = tmp_path / "cache", "sha256:" + "cd" * 32
    (cache / "models").mkdir(parents=True)
    engine = SharedEngine(cache, tmp_path / "mounts")
    rows = [
        {"digest": digest, "state": "Downloading", "sizeBytes": 100, "downloadedBytes": 41, "reason": None},
        {"digest": "sha256:" + "ef" * 32, "state": "Owned", "sizeBytes": 1, "downloadedBytes": 0},  # no state
        {"digest": "../../etc", "state": "Failed", "sizeBytes": 1, "downloadedBytes": 0},
    ]
    (cache / ENTRIES).write_text(json.dumps(rows))
    entry = engine.entry(digest)
    assert (entry.state, entry.size_bytes, entry.downloaded_bytes) == ("Downloading", 100, 41)
    assert engine.entry("sha256:" + "ef" * 32) is None
    (cache / ENTRIES).unlink()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(rows))
    (cache / ENTRIES).symlink_to(elsewhere)
    assert engine.entry(digest) is None  # a link is not followed
    (cache / ENTRIES).unlink()
    os.mkfifo(cache / ENTRIES)  # nothing writes it: opening it must not block the mounter
    assert engine.entry(digest) is None
