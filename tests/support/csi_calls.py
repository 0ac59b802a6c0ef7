"""What a kubelet sends a CSI node plugin to mount a model into a Pod: the Pod's volume context and the
NodePublishVolume request (one builder for the CSI tests and the chaos run's mounts)."""

from __future__ import annotations

from gpustack_models.plugin.csi.generated import csi_pb2

Mode = csi_pb2.VolumeCapability.AccessMode
POD_UID = "0b3f6f0e-7a51-4e6f-9d1e-6a1c5e0f0c11"
POD_UID_KEY = "csi.storage.k8s.io/pod.uid"


def pod_context(namespace, name="consumer", uid=POD_UID, artifact="art", **extra) -> dict:
    """The volume context of an ephemeral inline volume, as the kubelet passes it (podInfoOnMount)."""
    out = {
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/pod.namespace": namespace,
        "csi.storage.k8s.io/pod.name": name,
        POD_UID_KEY: uid,
        "csi.storage.k8s.io/serviceAccount.name": "default",
    }
    if artifact is not None:
        out["artifact"] = artifact
    out.update(extra)
    return out


def publish_request(volume_id, target, context, *, readonly=True, mode=Mode.SINGLE_NODE_WRITER, block=False):
    """A NodePublishVolumeRequest for ``target`` (a mount, or a raw block device with ``block``)."""
    cap = csi_pb2.VolumeCapability(access_mode=Mode(mode=mode))
    if block:
        cap.block.SetInParent()
    else:
        cap.mount.SetInParent()
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=volume_id, target_path=str(target), volume_capability=cap, readonly=readonly,
        volume_context=context,
    )  # fmt: skip
