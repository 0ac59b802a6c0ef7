"""What a NodePublishVolume / NodeUnpublishVolume request must carry, checked before anything is done.

Every refusal is a ``CsiError`` with a gRPC code and a message naming the field. What the kubelet sends
for an inline ephemeral volume of a driver with ``podInfoOnMount: true``: ``readonly`` from the Pod's
``csi.readOnly``, the access mode ``SINGLE_NODE_WRITER`` (the kubelet maps every inline volume to
ReadWriteOnce), a mount access type, and in ``volume_context`` the Pod's attributes next to
``csi.storage.k8s.io/ephemeral: "true"``, ``pod.namespace``, ``pod.name``, ``pod.uid`` and
``serviceAccount.name``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import grpc

from gpustack_models.kube.volumes import (
    ARTIFACT,
    ATTRIBUTES,
    DIGEST_PATTERN,
    EXPECTED_DIGEST,
    KUBE_PREFIX,
    NAME_MAX,
    NAME_PATTERN,
    unknown_attributes,
)
from gpustack_models.plugin.csi.generated import csi_pb2

EPHEMERAL = KUBE_PREFIX + "ephemeral"
POD_NAMESPACE, POD_NAME, POD_UID = (KUBE_PREFIX + k for k in ("pod.namespace", "pod.name", "pod.uid"))
VOLUME_ID_MAX = 128  # bytes, as the CSI spec bounds identifiers
PATH_MAX = 4096

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(NAME_PATTERN)
_UID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_DIGEST = re.compile(DIGEST_PATTERN)
_Mode = csi_pb2.VolumeCapability.AccessMode
# Read-only content is the same for one reader or many; SINGLE_NODE_WRITER is what the kubelet sends
# for every inline volume (readonly=true still mounts read-only). Modes of several writers are refused.
ACCEPTED_MODES = {
    _Mode.SINGLE_NODE_WRITER,
    _Mode.SINGLE_NODE_READER_ONLY,
    _Mode.MULTI_NODE_READER_ONLY,
    _Mode.SINGLE_NODE_SINGLE_WRITER,
}


class CsiError(Exception):
    """A refusal: the gRPC status code and the message the caller (the kubelet, the Pod's events) shows."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def invalid(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str

    def as_dict(self) -> dict:
        return {"namespace": self.namespace, "name": self.name, "uid": self.uid}


@dataclass(frozen=True)
class PublishRequest:
    volume_id: str
    target_path: str
    pod: Pod
    artifact: str
    expected_digest: str | None


def volume_id(raw: str) -> str:
    if not raw:
        raise invalid("volume_id is required")
    if len(raw.encode()) > VOLUME_ID_MAX or not raw.isprintable():
        raise invalid(f"volume_id must be at most {VOLUME_ID_MAX} bytes of printable characters")
    return raw


def target_path(raw: str, kubelet_dir: str | None) -> str:
    """An absolute, normalised path (no ``.``, ``..`` or ``//``), under ``<kubelet dir>/pods/`` when the
    kubelet's directory is known. Symbolic links are checked where the path is used (``mounts``)."""
    if not raw:
        raise invalid("target_path is required")
    if len(raw) > PATH_MAX or "\0" in raw or not raw.isprintable():
        raise invalid("target_path is not a usable path")
    if not os.path.isabs(raw) or os.path.normpath(raw) != raw or raw == "/":
        raise invalid(f"target_path {raw!r} must be an absolute, normalised path (no '.', '..' or '//')")
    pods = pods_dir(kubelet_dir)
    if pods is not None and not raw.startswith(pods + os.sep):
        raise invalid(f"target_path {raw!r} is not under the kubelet's pods directory {pods}")
    return raw


def pods_dir(kubelet_dir: str | None) -> str | None:
    return os.path.join(os.path.normpath(kubelet_dir), "pods") if kubelet_dir else None


def capability(cap, readonly: bool) -> None:
    """A read-only mount: ``readonly`` set, a mount access type, an access mode without several writers."""
    if cap is None or not cap.ListFields():
        raise invalid("volume_capability is required")
    if cap.WhichOneof("access_type") != "mount":
        raise invalid("only mount volumes are served (this driver has no block volumes)")
    if cap.access_mode.mode not in ACCEPTED_MODES:
        name = _Mode.Mode.Name(cap.access_mode.mode) if cap.access_mode.mode in _Mode.Mode.values() else "?"
        raise invalid(f"access mode {name} is not served: models are mounted read-only")
    if not readonly:
        raise invalid("the volume must be read-only: set readOnly: true on the Pod's csi volume")


def _pod(context: dict) -> Pod:
    missing = [k for k in (POD_NAMESPACE, POD_NAME, POD_UID) if not context.get(k)]
    if missing:
        raise invalid(
            f"the Pod's attributes are missing ({', '.join(missing)}): the CSIDriver object must set"
            " podInfoOnMount: true"
        )
    namespace, name, uid = context[POD_NAMESPACE], context[POD_NAME], context[POD_UID]
    if not _LABEL.fullmatch(namespace):
        raise invalid(f"{POD_NAMESPACE} {namespace[:80]!r} is not a namespace name")
    if len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
        raise invalid(f"{POD_NAME} {name[:80]!r} is not a Pod name")
    if not _UID.fullmatch(uid):
        raise invalid(f"{POD_UID} {uid[:80]!r} is not a uid")
    return Pod(namespace, name, uid)


def _attributes(context: dict) -> tuple[str, str | None]:
    unknown = unknown_attributes(context)
    if unknown:
        shown = ", ".join(repr(k[:64]) for k in unknown[:5])
        raise invalid(f"unknown volume attributes {shown}: only {' and '.join(ATTRIBUTES)} are read")
    artifact = context.get(ARTIFACT, "")
    if not artifact:
        raise invalid(f"the volume attribute {ARTIFACT} is required (the ModelArtifact's name in the Pod's namespace)")
    if len(artifact) > NAME_MAX or not _SUBDOMAIN.fullmatch(artifact):
        raise invalid(f"{ARTIFACT} {artifact[:80]!r} is not a ModelArtifact name")
    expected = context.get(EXPECTED_DIGEST) or None
    if expected is not None and not _DIGEST.fullmatch(expected):
        raise invalid(f"{EXPECTED_DIGEST} {expected[:80]!r} is not sha256:<64 hex digits>")
    return artifact, expected


def publish_request(request, kubelet_dir: str | None) -> PublishRequest:
    """The NodePublishVolumeRequest checked field by field, in the order the CSI spec lists them."""
    vid = volume_id(request.volume_id)
    target = target_path(request.target_path, kubelet_dir)
    capability(request.volume_capability if request.HasField("volume_capability") else None, request.readonly)
    context = dict(request.volume_context)
    if context.get(EPHEMERAL) != "true":
        raise invalid(
            f'only inline ephemeral volumes are served ({EPHEMERAL} is not "true"): mount the model with a'
            " csi volume in the Pod's spec"
        )
    pod = _pod(context)
    artifact, expected = _attributes(context)
    return PublishRequest(vid, target, pod, artifact, expected)
