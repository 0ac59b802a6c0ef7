"""Pods that mount a model as a tenant writes them (inline ``csi`` volumes of ``model.csi.gpustack.ai``),
and the volume ids the kubelet gives those volumes: what the API's mount endpoint checks a plugin's
request against."""

from __future__ import annotations

import hashlib

DRIVER = "model.csi.gpustack.ai"


def volume_handle(pod_uid: str, volume_name: str) -> str:
    """The kubelet's volume id of an inline CSI volume: ``csi-`` and the hex SHA-256 of the Pod's uid followed
    by the volume's name (Kubernetes' ``makeVolumeHandle``, ``pkg/volume/csi/csi_mounter.go``)."""
    return "csi-" + hashlib.sha256(f"{pod_uid}{volume_name}".encode()).hexdigest()


def handle(pod: dict, volume_name: str = "model") -> str:
    """The volume id of ``pod``'s (as created: it has a uid) volume ``volume_name``."""
    return volume_handle(pod["metadata"]["uid"], volume_name)


def model_volume(name: str = "model", artifact: str = "art", expected_digest: str | None = None, **csi) -> dict:
    """A Pod's volume mounting ``artifact`` read-only (``csi``: more fields of the csi source, ``driver`` too)."""
    attributes = {"artifact": artifact}
    if expected_digest is not None:
        attributes["expectedDigest"] = expected_digest
    return {"name": name, "csi": {"driver": DRIVER, "readOnly": True, "volumeAttributes": attributes, **csi}}


def model_pod(name: str, node: str, volumes: list[dict] | None = None, image: str = "example.invalid/none", **meta):
    """A Pod bound to ``node`` (no scheduler involved) with ``volumes`` (default: one ``model`` volume of
    ``art``), each mounted in its one container. ``meta``: more of its metadata."""
    volumes = [model_volume()] if volumes is None else volumes
    mounts = [{"name": v["name"], "mountPath": f"/models/{v['name']}", "readOnly": True} for v in volumes]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **meta},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": image, "volumeMounts": mounts}],
            "volumes": volumes,
        },
    }
