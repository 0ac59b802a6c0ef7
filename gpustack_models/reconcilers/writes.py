"""How the service writes to Kubernetes: server-side apply, one field manager per concern, so the resolver,
the roll-up and the prefetch controller each own their own fields of a status and never overwrite one
another:

    gpustack-models-resolver  ModelArtifact status.resolved, observedGeneration, the Resolved condition
    gpustack-models-rollup    ModelArtifact status.nodes
    gpustack-models-prefetch  ModelPrefetch status
    gpustack-models-worker    NodeModelStore (ownerReference to its Node, and spec)
    gpustack-models-placement-labels  a Node's artifacts.worker.gpustack.ai/ labels (``node_labels``)
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from gpustack_models import kube
from gpustack_models.kinds import GROUP, STORAGE_VERSION

log = logging.getLogger(__name__)

API = f"{GROUP}/{STORAGE_VERSION}"
APPLY_ATTEMPTS = 5
RESOLVER = "gpustack-models-resolver"
ROLLUP = "gpustack-models-rollup"
PREFETCHER = "gpustack-models-prefetch"
# The store spec's manager keeps its first name: installed stores' managedFields carry it.
STORE_SPEC = "gpustack-models-worker"


def artifact_path(namespace: str, name: str) -> str:
    return f"/apis/{API}/namespaces/{namespace}/modelartifacts/{name}"


def prefetch_path(namespace: str, name: str) -> str:
    return f"/apis/{API}/namespaces/{namespace}/modelprefetches/{name}"


def store_path(node: str) -> str:
    return f"/apis/{API}/nodemodelstores/{node}"


def apply_status(path: str, kind: str, metadata: dict, status: dict, manager: str) -> bool:
    """Apply ``status`` to the object at ``path`` as ``manager``; False when that object is gone.

    ``metadata`` carries the ``uid`` of the object the status was computed for. The write is made on the
    object as just read, its uid checked and its resourceVersion sent as the apply's precondition, so an
    answer for an object deleted and recreated under the same name never lands on the new one (a write
    that raced another writer is read and tried again; one that lost every time raises ``StillConflicting``,
    which the task tries again later)."""
    uid = metadata.get("uid")
    if not uid:
        raise ValueError(f"a status write to {path} needs the object's uid")
    client = kube.default()
    for _ in range(APPLY_ATTEMPTS):
        try:
            current = client.get(path)["metadata"]
        except kube.NotFound:
            return False
        if current.get("uid") != uid:
            log.info("not writing the status of %s: it was recreated", path)
            return False
        guarded = dict(metadata, resourceVersion=current["resourceVersion"])
        body = {"apiVersion": API, "kind": kind, "metadata": guarded, "status": status}
        try:
            client.apply(f"{path}/status", body, field_manager=manager)
            return True
        except kube.NotFound:
            return False
        except kube.Conflict:
            continue  # another writer got in between: read again
    raise kube.StillConflicting(f"status of {path} still conflicting after {APPLY_ATTEMPTS} attempts")


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
