"""What the kubelet makes of a Pod's inline CSI volumes: the volume id it gives the driver for each, and so
which volume of a Pod an id names. A node plugin's mount request and a recorded mount are checked against
the Pod's spec with these: the id is the kubelet's, not one the node chose.

Also what a model volume must be, in one place for everyone who checks it: the CSI driver at mount time
(``plugin.csi.validation``), the admission policy that refuses a malformed one at Pod create
(``install.volume_checks``, the same rules in CEL) and the webhooks that must not act on one (``volume_problems``).
A model volume is read-only (``csi.readOnly: true``: the driver refuses any other) and takes the attributes
``ATTRIBUTES`` only, besides the ``csi.storage.k8s.io/`` ones the kubelet adds (the driver ignores those).
The containers' ``volumeMounts`` are not checked: the driver never sees them, and its bind mount is
read-only whatever they say.
"""

from __future__ import annotations

import hashlib
import re

MODEL_DRIVER = "model.csi.gpustack.ai"
KUBE_PREFIX = "csi.storage.k8s.io/"  # the kubelet's own attributes (pod.name, ephemeral ...)
ARTIFACT, EXPECTED_DIGEST = "artifact", "expectedDigest"
ATTRIBUTES = (ARTIFACT, EXPECTED_DIGEST)  # what a Pod may set; the driver refuses any other
NAME_MAX = 253
# A ModelArtifact's name (a DNS subdomain) and a digest, as full-match patterns both Python and RE2 read alike.
NAME_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DIGEST_PATTERN = r"sha256:[0-9a-f]{64}"

# The problems' texts, shared with the admission policy's CEL (``install.volume_checks``): ``{path}`` is
# ``spec.volumes[<index>].csi``, ``{key}`` an attribute's name.
UNKNOWN = '{path}.volumeAttributes: unknown attribute "{key}": model volumes take ' + ", ".join(ATTRIBUTES)
REQUIRED = "{path}.volumeAttributes." + ARTIFACT + ": required: the name of a ModelArtifact in the Pod's namespace"
BAD_NAME = (
    "{path}.volumeAttributes." + ARTIFACT + f": must be a ModelArtifact name (a DNS subdomain of at most {NAME_MAX}"
    " characters)"
)
BAD_DIGEST = "{path}.volumeAttributes." + EXPECTED_DIGEST + ": must be sha256:<64 lowercase hex digits>"
NOT_READ_ONLY = "{path}.readOnly: must be true for model volumes"


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


def unknown_attributes(attributes: dict) -> list[str]:
    return sorted(str(k) for k in attributes if k not in ATTRIBUTES and not str(k).startswith(KUBE_PREFIX))


def valid_name(name) -> bool:
    return isinstance(name, str) and len(name) <= NAME_MAX and re.fullmatch(NAME_PATTERN, name) is not None


def volume_problems(index: int, volume: dict) -> list[str]:
    """What is wrong with the model volume ``volume`` (the Pod's ``index``-th), in the admission policy's
    words and order; empty for a good one, or for a volume that is no model volume."""
    attributes = model_attributes(volume) if isinstance(volume, dict) else None
    if attributes is None:
        return []
    path = f"spec.volumes[{index}].csi"
    problems = [UNKNOWN.format(path=path, key=key) for key in unknown_attributes(attributes)]
    artifact = attributes.get(ARTIFACT)
    if artifact is None or artifact == "":
        problems.append(REQUIRED.format(path=path))
    elif not valid_name(artifact):
        problems.append(BAD_NAME.format(path=path))
    digest = attributes.get(EXPECTED_DIGEST)
    if digest not in (None, "") and not (isinstance(digest, str) and re.fullmatch(DIGEST_PATTERN, digest)):
        problems.append(BAD_DIGEST.format(path=path))
    if volume["csi"].get("readOnly") is not True:
        problems.append(NOT_READ_ONLY.format(path=path))
    return problems


def pod_problems(pod) -> list[str]:
    """The problems of every model volume of ``pod``, volume by volume (what the admission policy refuses)."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    volumes = spec.get("volumes") if isinstance(spec, dict) else None
    if not isinstance(volumes, list):
        return []
    return [problem for index, volume in enumerate(volumes) for problem in volume_problems(index, volume)]
