"""What the kubelet makes of a Pod's inline CSI volumes: the volume id it gives the driver for each, and so
which volume of a Pod an id names. A node plugin's mount request and a recorded mount are checked against
the Pod's spec with these: the id is the kubelet's, not one the node chose."""

from __future__ import annotations

import hashlib

MODEL_DRIVER = "model.csi.gpustack.ai"


def volume_handle(pod_uid: str, volume_name: str) -> str:
    """The volume id the kubelet gives a Pod's inline CSI volume: ``csi-`` and the hex SHA-256 of the Pod's
    uid followed by the volume's name (``makeVolumeHandle`` in Kubernetes' ``pkg/volume/csi``)."""
    return "csi-" + hashlib.sha256(f"{pod_uid}{volume_name}".encode()).hexdigest()


def volume_of(pod: dict, volume_id: str) -> dict | None:
    """The volume of ``pod``'s spec whose kubelet volume id is ``volume_id``, or None."""
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if isinstance(volume, dict) and volume_handle(uid, str(volume.get("name") or "")) == volume_id:
            return volume
    return None


def model_attributes(volume: dict) -> dict | None:
    """The ``volumeAttributes`` of a ``csi`` volume of ``model.csi.gpustack.ai`` (empty if it has none), or
    None for any other volume."""
    csi = volume.get("csi")
    if not isinstance(csi, dict) or csi.get("driver") != MODEL_DRIVER:
        return None
    attributes = csi.get("volumeAttributes")
    return attributes if isinstance(attributes, dict) else {}
