"""The ``progress`` subresource of a ModelArtifact: how far its content is across the cluster.

Until node reports exist, every artifact answers the zeros-and-reason form.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from django.http import HttpResponse

from . import kube


def zeros(name: str, namespace: str, reason: str, digest: str = "", size: int = 0) -> dict:
    return {
        "kind": "ModelArtifactProgress",
        "apiVersion": "worker.gpustack.ai/v1",
        "metadata": {"name": name, "namespace": namespace},
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "manifestDigest": digest,
        "sizeBytes": size,
        "ready": 0,
        "downloading": 0,
        "failed": 0,
        "downloadingBytes": 0,
        "live": 0,
        "failureReasons": [],
        "reason": reason,
    }


def progress_response(view, request) -> HttpResponse:
    resp = kube.worker().request("GET", view.upstream_path())
    if resp.status != 200:
        return view.passthrough(resp)
    artifact = resp.json()
    body = zeros(view.name, view.namespace, "NotResolved")
    return HttpResponse(json.dumps(body), content_type="application/json")
