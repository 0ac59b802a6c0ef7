"""How the worker writes to Kubernetes: server-side apply, one field manager per concern, so the resolver,
the roll-up and the prefetch controller each own their own fields of a status and never overwrite one
another:

    gpustack-models-resolver  ModelArtifact status.resolved, observedGeneration, the Resolved condition
    gpustack-models-rollup    ModelArtifact status.nodes
    gpustack-models-prefetch  ModelPrefetch status
    gpustack-models-worker    NodeModelStore (ownerReference to its Node, and spec)
"""

from __future__ import annotations

from datetime import UTC, datetime

from gpustack_models import kube
from gpustack_models.kinds import GROUP, STORAGE_VERSION

API = f"{GROUP}/{STORAGE_VERSION}"
RESOLVER = "gpustack-models-resolver"
ROLLUP = "gpustack-models-rollup"
PREFETCHER = "gpustack-models-prefetch"
WORKER = "gpustack-models-worker"


def artifact_path(namespace: str, name: str) -> str:
    return f"/apis/{API}/namespaces/{namespace}/modelartifacts/{name}"


def prefetch_path(namespace: str, name: str) -> str:
    return f"/apis/{API}/namespaces/{namespace}/modelprefetches/{name}"


def store_path(node: str) -> str:
    return f"/apis/{API}/nodemodelstores/{node}"


def apply_status(path: str, kind: str, metadata: dict, status: dict, manager: str) -> bool:
    """Apply ``status`` to the object at ``path`` as ``manager``; False when the object is gone."""
    body = {"apiVersion": API, "kind": kind, "metadata": metadata, "status": status}
    try:
        kube.worker().apply(f"{path}/status", body, field_manager=manager)
    except kube.NotFound:
        return False
    return True


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, status: str, reason: str, message: str, previous: dict | None, generation: int) -> dict:
    """A condition whose lastTransitionTime moves only when its status does."""
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else None
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32000],
        "lastTransitionTime": since or now_iso(),
        "observedGeneration": generation,
    }


def find_condition(obj: dict, type_: str) -> dict:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return {}
