"""The worker's reconcilers: what the cluster should say, computed from the mirror, written as the worker.

Every write is a server-side apply with a field manager per concern, so the resolver, the roll-up and the
prefetch controller each own their own fields of a status and never overwrite one another:

    gpustack-models-resolver  ModelArtifact status.resolved, observedGeneration, the Resolved condition
    gpustack-models-rollup    ModelArtifact status.nodes
    gpustack-models-prefetch  ModelPrefetch status
    gpustack-models-worker    NodeModelStore (ownerReference to its Node, and spec)
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction

from . import kube
from .models import Artifact, Manifest, Node, NodeStore, PluginPod, Prefetch, Resolution, StoreEntry
from .resources.kinds import GROUP, STORAGE_VERSION
from .sources import SourceError, build_manifest, huggingface, modelscope

log = logging.getLogger(__name__)

API = f"{GROUP}/{STORAGE_VERSION}"
RESOLVER = "gpustack-models-resolver"
ROLLUP = "gpustack-models-rollup"
PREFETCHER = "gpustack-models-prefetch"
WORKER = "gpustack-models-worker"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def artifact_path(namespace: str, name: str) -> str:
    return f"/apis/{API}/namespaces/{namespace}/modelartifacts/{name}"


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


# --- Resolution ------------------------------------------------------------------------------------------

RETRYABLE = ("SourceUnavailable", "SecretNotFound", "ClaimNotFound")


def needs_resolution(obj: dict) -> bool:
    """Not yet resolved for its generation (a written failure for this generation counts as an answer)."""
    generation = (obj.get("metadata") or {}).get("generation") or 0
    status = obj.get("status") or {}
    if status.get("observedGeneration") != generation:
        return True
    return find_condition(obj, "Resolved").get("reason") in RETRYABLE


@dataclass
class Outcome:
    reason: str
    retry: bool = False
    retry_after: float | None = None


def resolve(namespace: str, name: str) -> Outcome:
    client = kube.worker()
    try:
        obj = client.get(artifact_path(namespace, name))
    except kube.KubeError as exc:
        if exc.status == 404:
            return Outcome("Gone")
        raise
    generation = obj["metadata"].get("generation") or 0
    status = obj.get("status") or {}
    previous = find_condition(obj, "Resolved")
    if status.get("observedGeneration") == generation and previous.get("status") == "True":
        return Outcome("Resolved")
    spec = obj.get("spec") or {}
    source = spec.get("source") or {}
    already = bool((status.get("resolved") or {}).get("manifestDigest"))

    def fail(reason: str, message: str, retry: bool, retry_after: float | None = None) -> Outcome:
        # A temporary failure never revokes an earlier resolution: keep Resolved=True then.
        if not (retry and already):
            write_resolution(obj, None, condition("Resolved", "False", reason, message, previous, generation))
        log.info("resolving %s/%s: %s: %s", namespace, name, reason, message)
        return Outcome(reason, retry=retry, retry_after=retry_after)

    if "persistentVolumeClaim" in source:
        claim = source["persistentVolumeClaim"]["claimName"]
        try:
            client.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        except kube.KubeError as exc:
            if exc.status == 404:
                return fail("ClaimNotFound", f"PersistentVolumeClaim {claim!r} does not exist in {namespace}", True)
            raise
        write_resolution(
            obj, {}, condition("Resolved", "True", "Resolved", f"claim {claim} exists", previous, generation)
        )
        return Outcome("Resolved")

    member_name = "huggingFace" if "huggingFace" in source else "modelScope"
    member = source.get(member_name) or {}
    token = None
    secret_name = (member.get("secretRef") or {}).get("name", "")
    if secret_name:
        try:
            secret = client.get(f"/api/v1/namespaces/{namespace}/secrets/{secret_name}")
        except kube.KubeError as exc:
            if exc.status == 404:
                return fail("SecretNotFound", f"Secret {secret_name!r} does not exist in {namespace}", True)
            raise
        raw = (secret.get("data") or {}).get("token")
        if not raw:
            return fail("SecretNotFound", f"Secret {secret_name!r} has no key 'token'", True)
        token = base64.b64decode(raw).decode().strip()

    hub = huggingface if member_name == "huggingFace" else modelscope
    endpoint = settings.HF_ENDPOINT if member_name == "huggingFace" else settings.MODELSCOPE_ENDPOINT
    revision = member.get("revision") or ("main" if member_name == "huggingFace" else "master")
    try:
        resolution = hub.resolve(
            member["repository"],
            revision,
            endpoint=endpoint,
            token=token,
            proxy=settings.HUB_PROXY or None,
            ca_bundle=settings.HUB_CA_BUNDLE or None,
            timeout=settings.HUB_TIMEOUT,
        )
        files, digest = build_manifest(resolution.files, spec.get("allowPatterns"), spec.get("ignorePatterns"))
    except SourceError as exc:
        return fail(exc.reason, exc.message, exc.retryable, exc.retry_after)
    expected = spec.get("expectedDigest")
    if expected and expected != digest:
        return fail("DigestMismatch", f"resolution produced {digest}, spec.expectedDigest is {expected}", False)

    size = sum(f.size for f in files)
    with transaction.atomic():
        manifest, _ = Manifest.objects.get_or_create(
            digest=digest,
            defaults={"files": [f.__dict__ for f in files], "file_count": len(files), "size_bytes": size},
        )
        row = Artifact.objects.filter(namespace=namespace, name=name).first()
        if row is not None:
            Resolution.objects.update_or_create(
                artifact=row,
                defaults={
                    "generation": generation,
                    "manifest": manifest,
                    "source": member_name,
                    "endpoint": endpoint,
                    "repository": member["repository"],
                    "commit": resolution.commit,
                    "secret_name": secret_name,
                },
            )
    resolved = {"revision": resolution.commit, "manifestDigest": digest, "fileCount": len(files), "sizeBytes": size}
    write_resolution(
        obj,
        resolved,
        condition(
            "Resolved",
            "True",
            "Resolved",
            f"{member['repository']}@{revision} is {resolution.commit}",
            previous,
            generation,
        ),
    )
    return Outcome("Resolved")


def write_resolution(obj: dict, resolved: dict | None, cond: dict) -> None:
    """Apply the resolver's part of the status. ``resolved=None`` keeps what it was (a failure)."""
    meta = obj["metadata"]
    status = {"observedGeneration": meta.get("generation") or 0, "conditions": [cond]}
    if resolved is not None:
        if resolved:
            status["resolved"] = resolved
    elif (obj.get("status") or {}).get("resolved"):
        status["resolved"] = obj["status"]["resolved"]
    body = {
        "apiVersion": API,
        "kind": "ModelArtifact",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": status,
    }
    kube.worker().apply(artifact_path(meta["namespace"], meta["name"]) + "/status", body, field_manager=RESOLVER)


# --- NodeModelStores -------------------------------------------------------------------------------------


def prefetch_nodes(body: dict | None) -> list[str]:
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


BYTES_PER_SECOND_ANNOTATION = f"{GROUP}/download-bytes-per-second"
CONCURRENCY_ANNOTATION = f"{GROUP}/download-concurrency"


def _annotated_int(annotations: dict, key: str, default: int, minimum: int) -> int:
    try:
        value = int(annotations.get(key, default))
    except (TypeError, ValueError):
        log.warning("ignoring annotation %s=%r: not an integer", key, annotations.get(key))
        return default
    return value if value >= minimum else default


def store_spec(node: str, annotations: dict | None = None) -> dict:
    """The spec of ``node``'s store. A Node may carry its own download limits as annotations
    (``worker.gpustack.ai/download-bytes-per-second``, ``worker.gpustack.ai/download-concurrency``)."""
    annotations = annotations or {}
    hub = {}
    if settings.HF_ENDPOINT:
        hub["huggingFaceEndpoint"] = settings.HF_ENDPOINT
    if settings.MODELSCOPE_ENDPOINT:
        hub["modelScopeEndpoint"] = settings.MODELSCOPE_ENDPOINT
    if settings.HUB_PROXY:
        hub["proxy"] = settings.HUB_PROXY
    return {
        "watermarks": {"highPercent": settings.STORE_HIGH_PERCENT, "lowPercent": settings.STORE_LOW_PERCENT},
        "download": {
            "concurrency": _annotated_int(annotations, CONCURRENCY_ANNOTATION, settings.DOWNLOAD_CONCURRENCY, 1),
            "bytesPerSecond": _annotated_int(
                annotations, BYTES_PER_SECOND_ANNOTATION, settings.DOWNLOAD_BYTES_PER_SECOND, 0
            ),
        },
        "hub": hub,
        "models": desired_models(node),
    }


def node_store(node: str) -> str:
    """Make ``node``'s NodeModelStore exist (while the node runs the plugin) with the computed spec."""
    node_row = Node.objects.live().filter(name=node).first()
    runs_plugin = PluginPod.objects.live().filter(node=node, ready=True).exists()
    if node_row is None or not runs_plugin:
        return "no-plugin"
    spec = store_spec(node, (node_row.body.get("metadata") or {}).get("annotations") or {})
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_row.uid}
    store = NodeStore.objects.live().filter(name=node).first()
    if store is not None:
        current = store.body
        owners = (current.get("metadata") or {}).get("ownerReferences") or []
        if (current.get("spec") or {}) == spec and owner in [
            {k: o.get(k) for k in ("apiVersion", "kind", "name", "uid")} for o in owners
        ]:
            return "unchanged"
    body = {
        "apiVersion": API,
        "kind": "NodeModelStore",
        "metadata": {"name": node, "ownerReferences": [owner]},
        "spec": spec,
    }
    try:
        kube.worker().apply(f"/apis/{API}/nodemodelstores/{node}", body, field_manager=WORKER)
    except kube.KubeError as exc:
        if exc.status == 409 and "being deleted" in str(exc.body.get("message", "")):
            return "terminating"  # recreated when the deletion event arrives
        raise
    return "applied"


# --- Roll-ups --------------------------------------------------------------------------------------------


def digest_counts(digest: str, nodes: list[str] | None = None) -> dict:
    """Counts over the entries of ``digest`` (optionally on some nodes only)."""
    entries = StoreEntry.objects.filter(digest=digest, store__deleted=False)
    if nodes is not None:
        entries = entries.filter(node__in=nodes)
    ready = downloading = failed = 0
    percents = []
    for state, size, done in entries.values_list("state", "size_bytes", "downloaded_bytes"):
        if state == "Ready":
            ready += 1
        elif state == "Downloading":
            downloading += 1
            percents.append(min(100, int(done * 100 / size)) if size else 0)
        elif state == "Failed":
            failed += 1
    out = {"ready": ready, "downloading": downloading, "failed": failed}
    if percents:
        out["downloadingPercent"] = int(sum(percents) / len(percents))
    return out


def nodes_changed(old: dict, new: dict) -> bool:
    """Counts change, or the mean percent crosses a 5 % step (or appears/disappears)."""
    if any((old.get(k) or 0) != new.get(k, 0) for k in ("ready", "downloading", "failed")):
        return True
    if ("downloadingPercent" in old) != ("downloadingPercent" in new):
        return True
    if "downloadingPercent" in new:
        return old["downloadingPercent"] // 5 != new["downloadingPercent"] // 5
    return False


def rollup(digest: str) -> int:
    """Write ``status.nodes`` of every artifact with ``digest`` whose counts moved enough."""
    counts = digest_counts(digest)
    written = 0
    for artifact in Artifact.objects.live().filter(digest=digest):
        if not nodes_changed(artifact.nodes or {}, counts):
            continue
        body = {
            "apiVersion": API,
            "kind": "ModelArtifact",
            "metadata": {"name": artifact.name, "namespace": artifact.namespace},
            "status": {"nodes": counts},
        }
        try:
            kube.worker().apply(
                artifact_path(artifact.namespace, artifact.name) + "/status", body, field_manager=ROLLUP
            )
        except kube.KubeError as exc:
            if exc.status == 404:
                continue
            raise
        # Remember what was written so a burst of entry changes writes once per step.
        Artifact.objects.filter(pk=artifact.pk).update(nodes=counts)
        written += 1
    return written


# --- ModelPrefetch status --------------------------------------------------------------------------------


def prefetches_of_digest(digest: str) -> list[Prefetch]:
    artifacts = set(Artifact.objects.live().filter(digest=digest).values_list("namespace", "name"))
    return [p for p in Prefetch.objects.live() if (p.namespace, p.artifact_name) in artifacts]


def prefetch_status(namespace: str, name: str) -> bool:
    prefetch = Prefetch.objects.live().filter(namespace=namespace, name=name).first()
    if prefetch is None:
        return False
    nodes = list(prefetch.node_names or [])
    artifact = Artifact.objects.live().filter(namespace=namespace, name=prefetch.artifact_name).first()
    digest = artifact.digest if artifact else ""
    counts = digest_counts(digest, nodes) if digest else {"ready": 0, "downloading": 0, "failed": 0}
    desired = len(nodes)
    needed = prefetch.min_ready or desired
    generation = (prefetch.body.get("metadata") or {}).get("generation") or 0
    previous = {c.get("type"): c for c in (prefetch.status or {}).get("conditions") or []}
    if artifact is None:
        waiting = ("ArtifactNotFound", f"ModelArtifact {prefetch.artifact_name!r} does not exist")
    elif not digest:
        waiting = ("ArtifactNotResolved", f"ModelArtifact {prefetch.artifact_name!r} is not resolved yet")
    else:
        waiting = None
    available = bool(digest) and desired > 0 and counts["ready"] >= needed
    progressing = bool(digest) and counts["ready"] < desired
    failures = (
        list(StoreEntry.objects.filter(digest=digest, node__in=nodes, state="Failed").values_list("reason", flat=True))
        if digest
        else []
    )
    conditions = [
        condition(
            "Available",
            "True" if available else "False",
            "MinimumReady" if available else (waiting[0] if waiting else "NotEnoughReady"),
            f"{counts['ready']} of {desired} nodes ready ({needed} needed)" if not waiting else waiting[1],
            previous.get("Available"),
            generation,
        ),
        condition(
            "Progressing",
            "True" if progressing else "False",
            "Downloading" if progressing else ("Complete" if digest else waiting[0]),
            f"{counts['downloading']} downloading, {counts['ready']} ready of {desired}",
            previous.get("Progressing"),
            generation,
        ),
        condition(
            "Degraded",
            "True" if failures else "False",
            (max(set(failures), key=failures.count) if failures else "AsExpected"),
            f"{len(failures)} nodes failed" if failures else "no node failed",
            previous.get("Degraded"),
            generation,
        ),
    ]
    status = {
        "observedGeneration": generation,
        "desiredNodes": desired,
        "readyNodes": counts["ready"],
        "downloadingNodes": counts["downloading"],
        "conditions": conditions,
    }
    if _same_status(prefetch.status or {}, status):
        return False
    body = {
        "apiVersion": API,
        "kind": "ModelPrefetch",
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    }
    try:
        kube.worker().apply(
            f"/apis/{API}/namespaces/{namespace}/modelprefetches/{name}/status", body, field_manager=PREFETCHER
        )
    except kube.KubeError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _same_status(old: dict, new: dict) -> bool:
    keys = ("observedGeneration", "desiredNodes", "readyNodes", "downloadingNodes")
    if any(old.get(k) != new.get(k) for k in keys):
        return False
    simplify = lambda conds: sorted((c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in conds)  # noqa: E731
    return simplify(old.get("conditions") or []) == simplify(new["conditions"])
