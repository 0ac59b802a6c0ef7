"""Mount references over time: they end when their Pod is gone, and an artifact no Pod mounts any more
loses its protection finalizer.

The node plugin records a mount (``MountReference``) through the API before it mounts a model into a
Pod's volume, and releases it when the volume is unpublished. A plugin that never gets to release (the
Pod deleted while the plugin was down, the node gone) must not hold the digest on the node, nor the
artifact's deletion, for ever: the mount check (Celery beat, every
``GPUSTACK_COLLECTION_INTERVAL_SECONDS``) reads each Pod of the mount references by name and ends the
references of a Pod that is gone, replaced (another uid), on another node, finished, whose node is gone,
or whose spec has no volume of that id mounting the artifact (the kubelet's volume id of a
``model.csi.gpustack.ai`` volume naming it, as the API checks before it records a mount: a reference
recorded otherwise, before that check existed, does not outlive one mount check). Their nodes are
reconciled (the digest gets its collection grace) and their artifacts released.

The finalizer ``worker.gpustack.ai/model-artifact-protection`` is lifted only while no mount of the
artifact remains, under the lock of the artifact's mirror row that the API holds while it records a
mount and adds the finalizer, so a mount racing the release keeps its protection. An artifact still
carrying the finalizer with no mount left (a release whose lift failed) loses it on the next check.
Every decision is logged with node, Pod, artifact and why.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from gpustack_models import kube
from gpustack_models.kube.volumes import model_attributes, volume_of
from gpustack_models.models import MOUNT_PROTECTION, Artifact, MountReference
from gpustack_models.reconcilers.writes import artifact_path

log = logging.getLogger(__name__)

_PATCH_ATTEMPTS = 5
_FINISHED = ("Succeeded", "Failed")


def ended_because(node: str, uid: str, pod: dict | None, node_present: bool, volume_id: str, artifact: str) -> str:
    """Why the mount of ``artifact`` by volume ``volume_id`` of Pod ``pod`` (None: not found) on ``node``
    ended, or "" while it holds."""
    if not node_present:
        return f"node {node} is gone"
    if pod is None:
        return "the Pod is gone"
    if (pod.get("metadata") or {}).get("uid") != uid:
        return "the Pod was replaced (another uid)"
    if (pod.get("spec") or {}).get("nodeName") != node:
        return f"the Pod is not on node {node}"
    phase = (pod.get("status") or {}).get("phase")
    if phase in _FINISHED:
        return f"the Pod finished ({phase})"
    volume = volume_of(pod, volume_id)
    if volume is None or (model_attributes(volume) or {}).get("artifact") != artifact:
        return f"the Pod has no model volume of that id mounting {artifact}"
    return ""


class _Reader:
    """Pods and nodes read live, once per check; None when not found, and a read error keeps the mount."""

    def __init__(self):
        self.pods: dict[tuple[str, str], dict | None] = {}
        self.nodes: dict[str, bool] = {}

    def _get(self, path: str) -> dict | None:
        try:
            return kube.default().get(path)
        except kube.NotFound:
            return None

    def pod(self, namespace: str, name: str) -> dict | None:
        if (namespace, name) not in self.pods:
            self.pods[namespace, name] = self._get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return self.pods[namespace, name]

    def node_present(self, node: str) -> bool:
        if node not in self.nodes:
            self.nodes[node] = self._get(f"/api/v1/nodes/{node}") is not None
        return self.nodes[node]


def check_mounts() -> tuple[set[str], set[tuple[str, str]]]:
    """End the mount references whose Pod is gone; the nodes and the artifacts (namespace, name) concerned."""
    reader, ended, alive = _Reader(), [], []
    rows = MountReference.objects.values_list(
        "pk", "node", "volume_id", "pod_namespace", "pod_name", "pod_uid", "artifact"
    )
    for pk, node, volume_id, namespace, name, uid, artifact in rows.iterator():
        try:
            why = ended_because(node, uid, reader.pod(namespace, name), reader.node_present(node), volume_id, artifact)
        except kube.StatusError as exc:
            log.warning("mount check: pod %s/%s on node %s not read (%s); its mounts kept", namespace, name, node, exc)
            continue
        if not why:
            alive.append(pk)
            continue
        log.info(
            "node %s: mount of %s by pod %s/%s (volume %s) ended: %s",
            node, artifact, namespace, name, volume_id, why,
        )  # fmt: skip
        ended.append((pk, node, namespace, artifact))
    MountReference.objects.filter(pk__in=[e[0] for e in ended]).delete()
    MountReference.objects.filter(pk__in=alive).update(last_seen=timezone.now())
    return {e[1] for e in ended}, {(e[2], e[3]) for e in ended}


def leftover_protections() -> set[tuple[str, str]]:
    """Artifacts carrying the protection finalizer while no mount of theirs remains."""
    rows = Artifact.objects.live().filter(body__metadata__has_key="finalizers")
    protected = {
        (ns, name)
        for ns, name, finalizers in rows.values_list("namespace", "name", "body__metadata__finalizers")
        if isinstance(finalizers, list) and MOUNT_PROTECTION in finalizers
    }
    if not protected:
        return set()
    mounted = set(
        MountReference.objects.filter(pod_namespace__in={ns for ns, _ in protected}).values_list(
            "pod_namespace", "artifact"
        )
    )
    return protected - mounted


def release_protection(namespace: str, name: str) -> bool:
    """Lift the finalizer from artifact ``namespace/name`` if no mount of it remains; True if lifted."""
    with transaction.atomic():
        list(Artifact.objects.select_for_update().filter(namespace=namespace, name=name).values("pk"))
        if MountReference.objects.filter(pod_namespace=namespace, artifact=name).exists():
            return False
        return _remove_finalizer(namespace, name)


def _remove_finalizer(namespace: str, name: str) -> bool:
    path = artifact_path(namespace, name)
    for _ in range(_PATCH_ATTEMPTS):
        try:
            metadata = kube.default().get(path).get("metadata") or {}
        except kube.NotFound:
            return False
        finalizers = metadata.get("finalizers") or []
        if MOUNT_PROTECTION not in finalizers:
            return False
        kept = [f for f in finalizers if f != MOUNT_PROTECTION]
        patch = {"metadata": {"finalizers": kept, "resourceVersion": metadata.get("resourceVersion")}}
        try:
            kube.default().json("PATCH", path, body=patch, content_type="application/merge-patch+json")
        except kube.Conflict:
            continue  # written meanwhile: read again
        except kube.NotFound:
            return False
        deleting = " (it was being deleted: the deletion proceeds)" if metadata.get("deletionTimestamp") else ""
        log.info(
            "modelartifact %s/%s: no Pod mounts it any more; %s removed%s", namespace, name, MOUNT_PROTECTION, deleting
        )
        return True
    log.warning("modelartifact %s/%s: %s not removed: it kept changing", namespace, name, MOUNT_PROTECTION)
    return False
