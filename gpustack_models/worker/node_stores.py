"""NodeModelStores: one per node that runs the plugin, owned by its Node, with the spec the worker computes.

The spec's ``models`` are the digests every reference to the node asks for (prefetches today); the worker
owns the whole spec as a server-side-apply field manager. A recreated store gets the computed spec at
once (the deletion event enqueues a reconcile).
"""

from __future__ import annotations

import logging

from django.conf import settings

from gpustack_models import kube
from gpustack_models.kinds import GROUP
from gpustack_models.models import Artifact, Node, NodeStore, PluginPod, Prefetch

from .writes import API, WORKER, store_path

log = logging.getLogger(__name__)

BYTES_PER_SECOND_ANNOTATION = f"{GROUP}/download-bytes-per-second"
CONCURRENCY_ANNOTATION = f"{GROUP}/download-concurrency"


def prefetch_nodes(body: dict | None) -> list[str]:
    """The nodes a ModelPrefetch body names."""
    if not body:
        return []
    return list((body.get("spec") or {}).get("nodeNames") or [])


def desired_models(node: str) -> list[dict]:
    """spec.models of ``node``: the digests of resolved artifacts every reference to the node names."""
    wanted: dict[str, bool] = {}
    prefetches = [p for p in Prefetch.objects.live() if node in (p.node_names or [])]
    for prefetch in prefetches:
        artifact = Artifact.objects.live().filter(namespace=prefetch.namespace, name=prefetch.artifact_name).first()
        if artifact is None or not artifact.digest:
            continue
        wanted[artifact.digest] = wanted.get(artifact.digest, False) or prefetch.pinned
    return [{"digest": d, "pinned": wanted[d]} for d in sorted(wanted)]


def _annotated_int(annotations: dict, key: str, default: int, minimum: int) -> int:
    try:
        value = int(annotations.get(key, default))
    except (TypeError, ValueError):
        log.warning("ignoring annotation %s=%r: not an integer", key, annotations.get(key))
        return default
    return value if value >= minimum else default


def hub_spec() -> dict:
    hub = {}
    if settings.HF_ENDPOINT:
        hub["huggingFaceEndpoint"] = settings.HF_ENDPOINT
    if settings.MODELSCOPE_ENDPOINT:
        hub["modelScopeEndpoint"] = settings.MODELSCOPE_ENDPOINT
    if settings.HUB_PROXY:
        hub["proxy"] = settings.HUB_PROXY
    return hub


def store_spec(node: str, annotations: dict | None = None) -> dict:
    """The spec of ``node``'s store. A Node may carry its own download limits as annotations
    (``worker.gpustack.ai/download-bytes-per-second``, ``worker.gpustack.ai/download-concurrency``)."""
    annotations = annotations or {}
    concurrency = _annotated_int(annotations, CONCURRENCY_ANNOTATION, settings.DOWNLOAD_CONCURRENCY, 1)
    rate = _annotated_int(annotations, BYTES_PER_SECOND_ANNOTATION, settings.DOWNLOAD_BYTES_PER_SECOND, 0)
    return {
        "watermarks": {"highPercent": settings.STORE_HIGH_PERCENT, "lowPercent": settings.STORE_LOW_PERCENT},
        "download": {"concurrency": concurrency, "bytesPerSecond": rate},
        "hub": hub_spec(),
        "models": desired_models(node),
    }


def _owned_by(body: dict, owner: dict) -> bool:
    owners = (body.get("metadata") or {}).get("ownerReferences") or []
    return owner in [{k: o.get(k) for k in ("apiVersion", "kind", "name", "uid")} for o in owners]


def reconcile_node_store(node: str) -> str:
    """Make ``node``'s NodeModelStore exist (while the node runs the plugin) with the computed spec."""
    node_row = Node.objects.live().filter(name=node).first()
    runs_plugin = PluginPod.objects.live().filter(node=node, ready=True).exists()
    if node_row is None or not runs_plugin:
        return "no-plugin"
    spec = store_spec(node, (node_row.body.get("metadata") or {}).get("annotations") or {})
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_row.uid}
    store = NodeStore.objects.live().filter(name=node).first()
    if store is not None and (store.body.get("spec") or {}) == spec and _owned_by(store.body, owner):
        return "unchanged"
    body = {
        "apiVersion": API,
        "kind": "NodeModelStore",
        "metadata": {"name": node, "ownerReferences": [owner]},
        "spec": spec,
    }
    try:
        kube.worker().apply(store_path(node), body, field_manager=WORKER)
    except kube.Conflict as exc:
        if exc.being_deleted:
            return "terminating"  # recreated when the deletion event arrives
        raise
    return "applied"
