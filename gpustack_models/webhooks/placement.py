"""Placement preference: the mutating admission webhook for Pods that mount a model.

kube-apiserver calls ``POST /internal/v1/placement`` with an ``AdmissionReview`` for every Pod create whose
spec has a ``model.csi.gpustack.ai`` volume (the webhook configuration's ``matchConditions`` keep every
other Pod away). The answer adds one ``preferredDuringSchedulingIgnoredDuringExecution`` node-affinity term
per mounted artifact: ``matchFields metadata.name In [...]``, at most ``MAX_NODES`` nodes holding the
artifact's digest Ready, weight 1 (the lowest weight that still breaks a tie). Never a required term: GPU
fit and every other rule of the scheduler come first, and a Pod whose resources fit only elsewhere still
schedules. The webhook never refuses a Pod (``failurePolicy: Ignore`` besides): what it cannot place it
admits unchanged, and so a Pod with a malformed model volume (``kube.volumes.pod_problems``, which the
admission policy ``install.volume_checks`` refuses after the mutating webhooks ran).

Who may call: the answer names nodes holding a namespace's model, which a tenant never sees. The caller
authenticates (kube-apiserver with the client certificate its admission configuration gives it, or a
bearer token) and needs ``post`` on the non-resource URL ``/internal/v1/placement`` (RBAC).

Where kube-apiserver cannot present a client certificate (``GPUSTACK_PLACEMENT_MODE=nodeLabels``), the
Celery worker labels the Nodes holding each artifact (``kinds.placement_labels``) and the webhook takes any
caller: its answer is then a pure function of the request, one preferred term per mounted artifact
``matchExpressions [{key: <the artifact's label>, operator: Exists}]``, computed without reading the
database or the cluster, so a forged review learns nothing its sender could not compute. A malformed body
is still a 400 ``Status``.
"""

from __future__ import annotations

import base64
import json
import logging

from django.conf import settings
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from gpustack_models.api import api_metrics
from gpustack_models.api.authentication import ClientCertificateAuthentication, TokenReviewAuthentication
from gpustack_models.api.views import KubeAPIView
from gpustack_models.kinds.placement_labels import label_key
from gpustack_models.kube.errors import BadRequest
from gpustack_models.kube.volumes import pod_problems
from gpustack_models.models import Artifact, EntryState, SourceKind, StoreEntry
from gpustack_models.prepared import Prepared

log = logging.getLogger(__name__)

DRIVER = "model.csi.gpustack.ai"
REVIEW_VERSION = "admission.k8s.io/v1"
MAX_NODES = 100
WEIGHT = 1
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
NODE_LABELS = "nodeLabels"


def mounted_artifacts(pod: dict) -> list[str]:
    """The artifact names of ``pod``'s model volumes, in order, each once."""
    names: list[str] = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        csi = volume.get("csi") if isinstance(volume, dict) else None
        if not isinstance(csi, dict) or csi.get("driver") != DRIVER:
            continue
        attributes = csi.get("volumeAttributes")
        name = attributes.get("artifact") if isinstance(attributes, dict) else None
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return names


def _digests(namespace: str, names: list[str]):
    artifacts = Artifact.objects.live().filter(namespace=namespace, name__in=names)
    return artifacts.exclude(digest="").exclude(source=SourceKind.CLAIM).values_list("name", "digest")


def _ready_nodes(digest: str):
    entries = StoreEntry.objects.claimed().filter(digest=digest, state=EntryState.READY)
    return entries.order_by("node").values_list("node")[:MAX_NODES]


# Compiled once per process: on every Pod create Django's compilation cost more than the two queries.
_DIGESTS = Prepared(_digests)
_READY_NODES = Prepared(_ready_nodes)


def holders(namespace: str, artifacts: list[str]) -> list[list[str]]:
    """For each resolved, downloadable artifact of ``namespace`` among ``artifacts``: the nodes holding its
    digest Ready (at most ``MAX_NODES``, by name). Artifacts held nowhere give no list."""
    digests = dict(_DIGESTS.rows(namespace, artifacts))
    out = []
    for name in artifacts:
        digest = digests.get(name)
        if not digest:
            continue
        nodes = [node for (node,) in _READY_NODES.rows(digest)]
        if nodes:
            out.append(nodes)
    return out


def preference(nodes: list[str]) -> dict:
    return {
        "weight": WEIGHT,
        "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": nodes}]},
    }


def label_preference(namespace: str, artifact: str) -> dict:
    """The preference for the nodes labelled as holding ``namespace/artifact`` (the node-labels mode)."""
    expression = {"key": label_key(namespace, artifact), "operator": "Exists"}
    return {"weight": WEIGHT, "preference": {"matchExpressions": [expression]}}


def affinity_patch(pod: dict, node_lists: list[list[str]]) -> list[dict]:
    """JSON Patch operations adding one preferred term per node list to ``pod``, keeping what it has."""
    return terms_patch(pod, [preference(nodes) for nodes in node_lists])


def terms_patch(pod: dict, terms: list[dict]) -> list[dict]:
    """JSON Patch operations adding the preferred ``terms`` to ``pod``, keeping what it has."""
    if not terms:
        return []
    affinity = (pod.get("spec") or {}).get("affinity")
    if not isinstance(affinity, dict):
        return [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {_PREFERRED: terms}}}]
    node_affinity = affinity.get("nodeAffinity")
    if not isinstance(node_affinity, dict):
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {_PREFERRED: terms}}]
    path = f"/spec/affinity/nodeAffinity/{_PREFERRED}"
    if not isinstance(node_affinity.get(_PREFERRED), list):
        return [{"op": "add", "path": path, "value": terms}]
    return [{"op": "add", "path": f"{path}/-", "value": term} for term in terms]


def review_request(body) -> dict:
    """The ``request`` of an AdmissionReview body; ``BadRequest`` naming what is wrong otherwise."""
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        raise BadRequest("expected an AdmissionReview")
    if body.get("apiVersion") != REVIEW_VERSION:
        raise BadRequest(
            f"apiVersion: Unsupported value: {body.get('apiVersion')!r}: supported values: {REVIEW_VERSION}"
        )
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadRequest("request.uid: Required value")
    return request


def patch_for(request: dict, by_labels: bool = False) -> list[dict]:
    """The patch for a review's ``request``: the nodes holding each artifact (the mirror), or with
    ``by_labels`` the nodes labelled as holding it (from the request alone)."""
    pod = request.get("object")
    if request.get("operation") != "CREATE" or not isinstance(pod, dict) or pod.get("kind") != "Pod":
        return []
    if (pod.get("spec") or {}).get("nodeName"):
        return []  # already bound: nothing to prefer
    if pod_problems(pod):
        return []  # a model volume the admission policy refuses (and the driver would): nothing to place
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    namespace = request.get("namespace") or metadata.get("namespace") or ""
    artifacts = mounted_artifacts(pod)
    if not isinstance(namespace, str) or not namespace or not artifacts:
        return []
    if by_labels:
        return terms_patch(pod, [label_preference(namespace, name) for name in artifacts])
    return affinity_patch(pod, holders(namespace, artifacts))


def by_labels() -> bool:
    return settings.PLACEMENT_MODE == NODE_LABELS


class PlacementView(KubeAPIView):
    """kube-apiserver's caller, authenticated and authorized; in the node-labels mode, anyone (the answer
    is a function of the request alone)."""

    authentication_classes = [ClientCertificateAuthentication, TokenReviewAuthentication]
    parser_classes = [JSONParser]

    def get_authenticators(self):
        return [] if by_labels() else super().get_authenticators()

    def get_permissions(self):
        return [] if by_labels() else super().get_permissions()

    def post(self, request):
        review = request.data
        admission = review_request(review)
        response = {"uid": admission["uid"], "allowed": True}
        outcome = "unchanged"
        try:
            patch = patch_for(admission, by_labels=by_labels())
        except Exception:  # a placement we cannot compute must not fail the Pod: admit it unchanged
            log.exception("placement for pod %s/%s failed", admission.get("namespace"), admission.get("name"))
            patch, outcome = [], "error"
        if patch:
            outcome = "patched"
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        api_metrics.placement(outcome)
        return Response({"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "response": response})
