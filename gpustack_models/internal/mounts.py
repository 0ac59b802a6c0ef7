"""Mount references: the node plugin asks the API before it mounts an artifact's content into a Pod's
volume, and tells it when the volume is gone. Not part of the aggregated API: plugins call the API's
Service directly, with their Pod-bound token, as for fetch tickets.

``POST /internal/v1/mounts`` ``{"node", "volumeId", "pod": {"namespace", "name", "uid"}, "artifact",
"expectedDigest"}`` (``expectedDigest`` optional) is authorized from the cluster, never from the volume's
attributes alone. In this order, each refusal a ``Status``:

1. the body's shape (400 naming the field);
2. the token is the plugin's, bound to the node the body names (401, 403);
3. the Pod exists with that uid (404), is bound to that node (403), is not a static Pod (a mirror Pod
   its node made itself, 403) and has not finished (``Succeeded`` or ``Failed``, 409), read live;
4. the Pod asked for this mount: its spec has a volume whose kubelet volume id is ``volumeId`` (403), a
   ``csi`` volume of driver ``model.csi.gpustack.ai`` (403) whose ``volumeAttributes`` name ``artifact``
   (403) and the same ``expectedDigest`` (both absent or empty, or equal; 403). For an inline CSI volume the
   kubelet's volume id is ``csi-`` and the hex SHA-256 of the Pod's uid followed by the volume's name
   (``makeVolumeHandle`` in Kubernetes' ``pkg/volume/csi``): a node cannot choose it, so it cannot record
   two references for one volume nor mount for a volume the Pod does not have;
5. the ModelArtifact ``artifact`` exists in the Pod's namespace (404), read live; it is not being deleted
   (409), takes its files from a hub and not a claim (400), has a resolved content digest (409 with its
   ``Resolved`` condition's reason and message), which ``expectedDigest``, when given, equals (400).

The answer is ``{"digest", "namespace", "artifact", "sizeBytes", "fileCount"}``. Before it, the mount is
recorded (a ``MountReference``; the same node and volume id again updates it; at most 64 volumes per Pod,
409 past that; a Pod being deleted records no new volume, 409, as the kubelet starts no new volume for a
Pod whose termination has begun, while the volumes it already recorded may be published again, as the
kubelet does after a restart) and the artifact carries the finalizer
``worker.gpustack.ai/model-artifact-protection`` (so a deletion racing the mount waits for the Pod); then
the node's ``spec.models`` is reconciled (a reconciler's task), which places the digest.

``POST /internal/v1/mounts/release`` ``{"node", "volumeId"}`` (the same token) drops the record, if any,
and answers ``{}``; the service then reconciles the node and lifts the finalizer once no mount of the
artifact remains.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from celery import current_app
from django.db import transaction
from django.utils import timezone
from rest_framework.response import Response

from gpustack_models import kube
from gpustack_models.api.authentication import TokenReviewAuthentication
from gpustack_models.api.targets import is_dns_label, is_dns_subdomain
from gpustack_models.api.views import KubeAPIView
from gpustack_models.internal.tickets import BoundPlugin
from gpustack_models.kinds import GROUP, STORAGE_VERSION
from gpustack_models.kube.errors import BadRequest, Conflict, Forbidden, NotFound
from gpustack_models.kube.identity import NODE_NAME_EXTRA
from gpustack_models.kube.volumes import MODEL_DRIVER, model_attributes, volume_of
from gpustack_models.models import MOUNT_PROTECTION, Artifact, MountReference

log = logging.getLogger(__name__)

_VOLUME_ID = re.compile(r"[\x21-\x7e]{1,128}")  # printable ASCII, no space
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_PATCH_ATTEMPTS = 5
MAX_VOLUMES_PER_POD = 64  # mount references one Pod may hold on its node
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # a static Pod: its node made it, no tenant asked
FINISHED = ("Succeeded", "Failed")  # a finished Pod's containers never run again

RECONCILE_NODE = "gpustack_models.reconcile_node_store"
RELEASE_PROTECTION = "gpustack_models.release_mount_protection"
ROLLUP_DIGEST = "gpustack_models.rollup_digest"  # the artifact's Ready counts the nodes its Pods mount it on


@dataclass(frozen=True)
class MountRequest:
    node: str
    volume_id: str
    pod_namespace: str
    pod_name: str
    pod_uid: str
    artifact: str
    expected_digest: str | None = None


def _string(body: dict, field: str, valid, what: str, prefix: str = "") -> str:
    value = body.get(field)
    if not isinstance(value, str) or not valid(value):
        raise BadRequest(f"{prefix}{field} must be {what}")
    return value


def _node_and_volume(body) -> tuple[str, str]:
    if not isinstance(body, dict):
        raise BadRequest("the body of the request must be a JSON object")
    node = _string(body, "node", is_dns_subdomain, "a node name (a DNS subdomain of at most 253 characters)")
    volume_id = _string(body, "volumeId", _VOLUME_ID.fullmatch, "1 to 128 printable ASCII characters, no space")
    return node, volume_id


def parse_mount(body) -> MountRequest:
    """The mount a plugin asks for, or a 400 naming the first field that is wrong."""
    node, volume_id = _node_and_volume(body)
    pod = body.get("pod")
    if not isinstance(pod, dict):
        raise BadRequest("pod must be an object {namespace, name, uid}")
    namespace = _string(pod, "namespace", is_dns_label, "a namespace name (a DNS label)", "pod.")
    name = _string(pod, "name", is_dns_subdomain, "a Pod name (a DNS subdomain)", "pod.")
    uid = _string(pod, "uid", _UID.fullmatch, "a Pod uid", "pod.")
    artifact = _string(body, "artifact", is_dns_subdomain, "a ModelArtifact name (a DNS subdomain)")
    expected = body.get("expectedDigest")
    if expected is not None and (not isinstance(expected, str) or not _DIGEST.fullmatch(expected)):
        raise BadRequest("expectedDigest must be null or sha256: and 64 lowercase hex digits")
    return MountRequest(node, volume_id, namespace, name, uid.lower(), artifact, expected)


def parse_release(body) -> tuple[str, str]:
    return _node_and_volume(body)


def check_bound(user, node: str) -> None:
    """403 unless the plugin's token is bound to ``node`` (its Pod runs there)."""
    bound = user.extra_dict.get(NODE_NAME_EXTRA) or []
    if bound != [node]:
        raise Forbidden(f"this token is bound to node {bound[0] if bound else '(none)'}, not {node}")


def check_pod(req: MountRequest) -> dict:
    """The Pod exists with the uid given, is bound to the node asking and has not finished (read live)."""
    named = f"pod {req.pod_namespace}/{req.pod_name}"
    try:
        pod = kube.default().get(f"/api/v1/namespaces/{req.pod_namespace}/pods/{req.pod_name}")
    except kube.NotFound:
        raise NotFound(f"{named} not found") from None
    if (pod.get("metadata") or {}).get("uid") != req.pod_uid:
        raise NotFound(f"{named} not found (no Pod of uid {req.pod_uid})")
    if (pod.get("spec") or {}).get("nodeName") != req.node:
        raise Forbidden(f"{named} is not on node {req.node}")
    if MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {}):
        raise Forbidden(f"{named} is a static Pod (made by its node, not through the API): it cannot mount models")
    phase = (pod.get("status") or {}).get("phase")
    if phase in FINISHED:
        raise Conflict(f"{named} has finished (phase {phase}): it mounts nothing more")
    return pod


def check_volume(pod: dict, req: MountRequest) -> str:
    """403 unless the Pod's spec has the volume the kubelet publishes as ``req.volume_id``: a ``csi`` volume
    of this driver whose attributes name ``req.artifact`` and the same ``expectedDigest`` (absent and
    empty are the same, as the plugin reads them). Returns the volume's name."""
    named = f"pod {req.pod_namespace}/{req.pod_name}"
    volume = volume_of(pod, req.volume_id)
    if volume is None:
        raise Forbidden(f"volumeId {req.volume_id} is not the volume id of any volume of {named}")
    where = f"volume {volume['name']} of {named}"
    attributes = model_attributes(volume)
    if attributes is None:
        raise Forbidden(f"{where} is not a csi volume of driver {MODEL_DRIVER}")
    if attributes.get("artifact") != req.artifact:
        raise Forbidden(f"{where} does not name modelartifact {req.artifact} (its artifact attribute)")
    expected = attributes.get("expectedDigest") or None
    if expected != req.expected_digest:
        raise Forbidden(f"{where} has expectedDigest {expected or '(none)'}, not {req.expected_digest or '(none)'}")
    return volume["name"]


def artifact_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{STORAGE_VERSION}/namespaces/{namespace}/modelartifacts/{name}"


def read_artifact(req: MountRequest) -> dict:
    try:
        return kube.default().get(artifact_path(req.pod_namespace, req.artifact))
    except kube.NotFound:
        raise NotFound(f"modelartifact {req.artifact} not found in namespace {req.pod_namespace}") from None


def _resolved_condition(status: dict) -> dict:
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Resolved":
            return cond
    return {}


def mounted_content(artifact: dict, req: MountRequest) -> dict:
    """The answer for ``artifact`` (the object as stored), or the refusal it calls for."""
    named = f"modelartifact {req.artifact}"
    if (artifact.get("metadata") or {}).get("deletionTimestamp"):
        raise Conflict(f"{named} in namespace {req.pod_namespace} is being deleted")
    if "persistentVolumeClaim" in ((artifact.get("spec") or {}).get("source") or {}):
        raise BadRequest(f"{named} takes its files from a volume claim: mount the claim itself")
    status = artifact.get("status") or {}
    resolved = status.get("resolved") or {}
    digest = resolved.get("manifestDigest")
    if not digest:
        cond = _resolved_condition(status)
        why = f"{cond.get('reason') or 'Pending'}: {cond.get('message') or 'resolution has not finished'}"
        raise Conflict(f"{named} is not resolved yet ({why})")
    if req.expected_digest is not None and req.expected_digest != digest:
        raise BadRequest(f"expectedDigest {req.expected_digest} does not match the digest of {named}, {digest}")
    return {
        "digest": digest,
        "namespace": req.pod_namespace,
        "artifact": req.artifact,
        "sizeBytes": int(resolved.get("sizeBytes") or 0),
        "fileCount": int(resolved.get("fileCount") or 0),
    }


def protect(artifact: dict, req: MountRequest) -> dict:
    """Add the protection finalizer (a merge patch conditioned on the resourceVersion read, so no other
    finalizer is lost); read again on a conflict, refusing once the artifact is being deleted. Returns the
    answer for the artifact as protected."""
    path = artifact_path(req.pod_namespace, req.artifact)
    for _ in range(_PATCH_ATTEMPTS):
        answer = mounted_content(artifact, req)
        metadata = artifact.get("metadata") or {}
        finalizers = list(metadata.get("finalizers") or [])
        if MOUNT_PROTECTION in finalizers:
            return answer
        patch = {
            "metadata": {
                "finalizers": [*finalizers, MOUNT_PROTECTION],
                "resourceVersion": metadata.get("resourceVersion"),
            }
        }
        try:
            kube.default().json("PATCH", path, body=patch, content_type="application/merge-patch+json")
            return answer
        except kube.Conflict:
            artifact = read_artifact(req)
    raise Conflict(f"modelartifact {req.artifact} kept changing; try again")


def record(req: MountRequest, artifact: dict, answer: dict, terminating: bool) -> tuple[dict, MountReference | None]:
    """Write the mount's row under the lock of its artifact's mirror row (the service lifts the finalizer
    under the same lock), then protect the artifact; both or neither. A Pod being deleted (``terminating``)
    only publishes again the volumes it recorded. Returns the answer and the row the mount replaced, if any."""
    with transaction.atomic():
        list(Artifact.objects.select_for_update().filter(namespace=req.pod_namespace, name=req.artifact).values("pk"))
        previous = MountReference.objects.select_for_update().filter(node=req.node, volume_id=req.volume_id).first()
        if terminating and (previous is None or previous.pod_uid != req.pod_uid):
            raise Conflict(f"pod {req.pod_namespace}/{req.pod_name} is being deleted: it mounts no new volume")
        if previous is None and _pod_volumes(req) >= MAX_VOLUMES_PER_POD:
            raise Conflict(f"pod {req.pod_namespace}/{req.pod_name} already mounts {MAX_VOLUMES_PER_POD} model volumes")
        values = {
            "pod_namespace": req.pod_namespace,
            "pod_name": req.pod_name,
            "pod_uid": req.pod_uid,
            "artifact": req.artifact,
            "digest": answer["digest"],
            "size_bytes": answer["sizeBytes"],
            "last_seen": timezone.now(),
        }
        MountReference.objects.update_or_create(node=req.node, volume_id=req.volume_id, defaults=values)
        answer = protect(artifact, req)
        if answer["digest"] != values["digest"]:  # read again meanwhile: record the content answered
            MountReference.objects.filter(node=req.node, volume_id=req.volume_id).update(
                digest=answer["digest"], size_bytes=answer["sizeBytes"]
            )
    return answer, previous


def _pod_volumes(req: MountRequest) -> int:
    return MountReference.objects.filter(node=req.node, pod_uid=req.pod_uid).count()


def enqueue(task: str, *args: str) -> None:
    """Ask the reconcilers to act; the periodic resync catches up if the broker cannot be reached now."""
    try:
        current_app.send_task(task, args=list(args))
    except Exception:  # the mount is recorded: its node's spec follows within a resync
        log.warning("could not enqueue %s%s", task, args, exc_info=True)


class MountView(KubeAPIView):
    authentication_classes = [TokenReviewAuthentication]
    permission_classes = [BoundPlugin]

    def post(self, request):
        req = parse_mount(request.data)
        check_bound(request.user, req.node)
        pod = check_pod(req)
        volume = check_volume(pod, req)
        terminating = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
        artifact = read_artifact(req)
        answer, previous = record(req, artifact, mounted_content(artifact, req), terminating)
        log.info(
            "node %s: volume %s (%s) of pod %s/%s (uid %s) mounts %s (%s)",
            req.node, volume, req.volume_id, req.pod_namespace, req.pod_name, req.pod_uid, req.artifact,
            answer["digest"][:19],
        )  # fmt: skip
        enqueue(RECONCILE_NODE, req.node)
        if previous is None or previous.digest != answer["digest"]:
            enqueue(ROLLUP_DIGEST, answer["digest"])
        if previous is not None and (previous.pod_namespace, previous.artifact) != (req.pod_namespace, req.artifact):
            enqueue(RELEASE_PROTECTION, previous.pod_namespace, previous.artifact)
        return Response(answer)


class ReleaseView(KubeAPIView):
    authentication_classes = [TokenReviewAuthentication]
    permission_classes = [BoundPlugin]

    def post(self, request):
        node, volume_id = parse_release(request.data)
        check_bound(request.user, node)
        row = MountReference.objects.filter(node=node, volume_id=volume_id).first()
        if row is not None:
            MountReference.objects.filter(pk=row.pk).delete()
            log.info(
                "node %s: volume %s of pod %s/%s released; %s no longer mounted there by it",
                node, volume_id, row.pod_namespace, row.pod_name, row.digest[:19],
            )  # fmt: skip
            enqueue(RECONCILE_NODE, node)
            enqueue(RELEASE_PROTECTION, row.pod_namespace, row.artifact)
        return Response({})
