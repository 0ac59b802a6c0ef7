"""Warnings on a Pod's model volumes: the validating admission webhook ``POST /internal/v1/volumes``.

kube-apiserver calls it for every Pod create with a ``model.csi.gpustack.ai`` volume (the configuration's
``matchConditions`` keep every other Pod away). It always admits; for each model volume naming a
ModelArtifact that does not exist in the Pod's namespace, that is not resolved (or being deleted, or one of
a volume claim, or whose digest is not the volume's ``expectedDigest``: what the mount endpoint refuses,
as the mirror shows it) the answer carries a warning (``response.warnings``, which kubectl prints as
``Warning: ...``): the Pod would otherwise wait at mount with nothing but the kubelet's events to say
why. What the driver would refuse outright is the admission policy's to refuse (``install.volume_checks``):
a malformed volume gets no warning here.

Who may call: the warnings tell whether a namespace's artifacts exist and why they are not resolved. The
caller authenticates (kube-apiserver with the client certificate of its admission configuration, or a
bearer token) and needs ``post`` on the non-resource URL ``/internal/v1/volumes`` (RBAC), as for the
placement webhook; anyone else gets a 401 or 403 ``Status`` before the body is read. In the node-labels
placement mode (``GPUSTACK_PLACEMENT_MODE=nodeLabels``), where kube-apiserver cannot authenticate to the
API, the webhook is not registered at all: opening it to any caller, as the placement webhook is there,
would tell anyone which artifacts exist. A malformed body is a 400 ``Status``, one over the body limit a 413.
"""

from __future__ import annotations

import logging

from rest_framework.response import Response

from gpustack_models.api.authentication import ClientCertificateAuthentication, TokenReviewAuthentication
from gpustack_models.api.parsers import JSONParser
from gpustack_models.api.views import KubeAPIView
from gpustack_models.kube.volumes import ARTIFACT, EXPECTED_DIGEST, model_attributes, pod_problems
from gpustack_models.models import Artifact, ConditionStatus, SourceKind
from gpustack_models.webhooks.placement import REVIEW_VERSION, review_request

log = logging.getLogger(__name__)

MESSAGE_MAX = 120  # characters of a Resolved condition's message quoted (kube-apiserver cuts a warning at 256)


def named_artifacts(pod: dict) -> list[tuple[str, str, str]]:
    """(volume name, artifact name, expected digest or "") of each model volume of a well-formed ``pod``; none
    for a malformed one (the admission policy refuses it, with the reasons)."""
    if pod_problems(pod):
        return []
    out = []
    for volume in pod["spec"]["volumes"]:
        attributes = model_attributes(volume) if isinstance(volume, dict) else None
        if attributes is not None:
            out.append((str(volume.get("name") or ""), attributes[ARTIFACT], attributes.get(EXPECTED_DIGEST) or ""))
    return out


def resolved_condition(body: dict) -> dict:
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Resolved"), {})


def not_resolved(artifact: Artifact) -> str:
    """Why ``artifact`` is not resolved: its Resolved condition's reason and message, when it has one."""
    condition = resolved_condition(artifact.body if isinstance(artifact.body, dict) else {})
    reason = artifact.resolved_reason or condition.get("reason") or ""
    message = "".join(c if c.isprintable() else " " for c in str(condition.get("message") or ""))
    if len(message) > MESSAGE_MAX:
        message = message[: MESSAGE_MAX - 3] + "..."
    if not reason:
        return "is not resolved yet"
    return f"is not resolved yet ({reason}: {message})" if message else f"is not resolved yet ({reason})"


def problem(namespace: str, expected: str, artifact: Artifact | None) -> str | None:
    """What keeps a model volume (with ``expected``, its expectedDigest) from mounting ``artifact`` (the
    mirror's row, or None), as the mount endpoint would say it; None if nothing does."""
    if artifact is None:
        return f'does not exist in namespace "{namespace}"; the Pod will wait at mount until it does'
    metadata = artifact.body.get("metadata") if isinstance(artifact.body, dict) else None
    if isinstance(metadata, dict) and metadata.get("deletionTimestamp"):
        return "is being deleted; the Pod will not mount it"
    if artifact.source == SourceKind.CLAIM:
        return "takes its files from a volume claim: mount the claim itself; the Pod will not mount it"
    if artifact.resolved_status != ConditionStatus.TRUE or not artifact.digest:
        return f"{not_resolved(artifact)}; the Pod will wait at mount until it resolves"
    if expected and expected != artifact.digest:
        return f"has digest {artifact.digest}, not the volume's expectedDigest {expected}; the Pod will not mount it"
    return None


def warnings_for(namespace: str, pod: dict) -> list[str]:
    """One warning per model volume whose artifact does not exist in ``namespace``, is not resolved, or would
    be refused at mount for another reason the mirror shows."""
    volumes = named_artifacts(pod)
    if not namespace or not volumes:
        return []
    names = {name for _volume, name, _expected in volumes}
    artifacts = {a.name: a for a in Artifact.objects.live().filter(namespace=namespace, name__in=names)}
    out = []
    for volume, name, expected in volumes:
        why = problem(namespace, expected, artifacts.get(name))
        if why:
            out.append(f'model volume "{volume}": ModelArtifact "{name}" {why}')
    return out


def review_warnings(request: dict) -> list[str]:
    pod = request.get("object")
    if request.get("operation") != "CREATE" or not isinstance(pod, dict) or pod.get("kind") != "Pod":
        return []
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    namespace = request.get("namespace") or metadata.get("namespace") or ""
    return warnings_for(namespace, pod) if isinstance(namespace, str) else []


class VolumeWarningsView(KubeAPIView):
    """kube-apiserver's caller, authenticated and authorized (there is no open mode: see the module)."""

    authentication_classes = [ClientCertificateAuthentication, TokenReviewAuthentication]
    parser_classes = [JSONParser]

    def post(self, request):
        admission = review_request(request.data)
        response = {"uid": admission["uid"], "allowed": True}
        try:
            warnings = review_warnings(admission)
        except Exception:  # warnings we cannot compute must not fail the Pod: admit it without them
            log.exception("volume warnings for pod %s/%s failed", admission.get("namespace"), admission.get("name"))
            warnings = []
        if warnings:
            response["warnings"] = warnings
        return Response({"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "response": response})
