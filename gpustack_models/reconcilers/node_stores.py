"""NodeModelStores: one per node that runs the plugin, owned by its Node, with the spec the service computes.

The spec's ``models`` are what the reference model (``references``) places on the node, plus the digests
no longer referenced there for less than the collection grace (``GPUSTACK_COLLECTION_GRACE_SECONDS``),
listed with the ``collectTime`` at which they leave (a reconcile is sent for that moment when it comes
before the next collection pass); the plugin removes the tree once its digest left at that time. What was
placed is kept as ``Holding`` rows, so a recreated store gets the same spec at once (the deletion event
enqueues a reconcile) and a prefetch recreated within the grace finds its bytes. The
service owns the whole spec as a server-side-apply field manager (``STORE_SPEC``).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpustack_models import kube
from gpustack_models.informers import mirror
from gpustack_models.informers.reactions import enqueue, reacts_to
from gpustack_models.informers.sending import send, send_at
from gpustack_models.kinds import GROUP
from gpustack_models.kinds.nodemodelstore import MAX_BYTES_PER_SECOND, MAX_DOWNLOAD_CONCURRENCY, MAX_UPLOAD_CONNECTIONS
from gpustack_models.models import Holding, Node, NodeStore, PluginPod, Prefetch, PrefetchTarget
from gpustack_models.reconcilers.budgets import PINNING_ALLOWED_ANNOTATION, SHARE_ANNOTATIONS
from gpustack_models.reconcilers.references import Assignment, models_per_node, namespace_quotas, node_references, place
from gpustack_models.reconcilers.task_names import RECONCILE_NODE_STORE, RECONCILE_PREFETCH, ROLLUP_DIGEST
from gpustack_models.reconcilers.writes import API, STORE_SPEC, store_path

log = logging.getLogger(__name__)

BYTES_PER_SECOND_ANNOTATION = f"{GROUP}/download-bytes-per-second"
CONCURRENCY_ANNOTATION = f"{GROUP}/download-concurrency"
UPLOAD_CONNECTIONS_ANNOTATION = f"{GROUP}/upload-connections"
UPLOAD_BYTES_PER_SECOND_ANNOTATION = f"{GROUP}/upload-bytes-per-second"


def _spec_item(holding: Holding) -> dict:
    item = {"digest": holding.digest, "pinned": holding.pinned}
    if holding.collect_time is not None:
        item["collectTime"] = holding.collect_time.strftime("%Y-%m-%dT%H:%M:%SZ")
    return item


def _release(node: str, holding: Holding, now: datetime, grace: timedelta) -> bool:
    """An unreferenced holding: start its grace, or end it; True if it stays in spec.models."""
    if holding.collect_time is None:
        # Whole seconds, rounded up, as the spec writes them: what nodes are told is the time itself, and
        # never before the grace has run.
        end = now + grace
        holding.collect_time = end + timedelta(microseconds=(1_000_000 - end.microsecond) % 1_000_000)
        holding.save(update_fields=["collect_time"])
        log.info(
            "node %s: %s no longer referenced; it leaves spec.models at %s unless referenced again",
            node, holding.digest[:19], holding.collect_time.isoformat(),
        )  # fmt: skip
        return True
    if holding.collect_time > now:
        return True
    holding.delete()
    log.info(
        "node %s: collected %s: unreferenced for the grace (%ss)",
        node,
        holding.digest[:19],
        f"{grace.total_seconds():g}",
    )
    return False


def _hold(node: str, holding: Holding | None, digest: str, pinned: bool) -> Holding:
    if holding is None:
        log.info("node %s: %s referenced%s; added to spec.models", node, digest[:19], " (pinned)" if pinned else "")
        return Holding.objects.create(node=node, digest=digest, pinned=pinned)
    if holding.collect_time is not None or holding.pinned != pinned:
        if holding.collect_time is not None:
            log.info("node %s: %s referenced again within its grace; kept", node, digest[:19])
        holding.collect_time, holding.pinned = None, pinned
        holding.save(update_fields=["collect_time", "pinned"])
    return holding


def _trim(node: str, kept: list[Holding]) -> list[Holding]:
    """At most ``models_per_node()`` holdings: unreferenced ones whose grace ends first leave early."""
    extra = len(kept) - models_per_node()
    if extra <= 0:
        return kept
    waiting = sorted((h for h in kept if h.collect_time is not None), key=lambda h: h.collect_time)[:extra]
    for holding in waiting:
        holding.delete()
        log.info("node %s: %s left spec.models before its grace ended: the node is full", node, holding.digest[:19])
    gone = {h.pk for h in waiting}
    return [h for h in kept if h.pk not in gone]


def desired_models(node: str, assignment: Assignment, now: datetime | None = None) -> list[dict]:
    """spec.models of ``node``: the digests ``assignment`` holds, plus those unreferenced for less than the
    collection grace (with their ``collectTime``); the holdings are kept in the database."""
    now = now or timezone.now()
    grace = timedelta(seconds=settings.COLLECTION_GRACE_SECONDS)
    kept = []
    with transaction.atomic():
        rows = {h.digest: h for h in Holding.objects.select_for_update().filter(node=node)}
        for digest, pinned in assignment.held.items():
            kept.append(_hold(node, rows.pop(digest, None), digest, pinned))
        released = [h for h in rows.values() if h.collect_time is None]
        kept += [h for h in rows.values() if _release(node, h, now, grace)]
        kept = _trim(node, kept)
    _reconcile_when_due(node, [h.collect_time for h in released if h in kept], now)
    return [_spec_item(h) for h in sorted(kept, key=lambda h: h.digest)]


def _reconcile_when_due(node: str, graces: list[datetime], now: datetime) -> None:
    """The graces that began now end before the next collection pass: reconcile the node at the first end."""
    soon = [at for at in graces if at - now <= timedelta(seconds=settings.COLLECTION_INTERVAL_SECONDS)]
    if soon:
        transaction.on_commit(lambda: send_at(min(soon), RECONCILE_NODE_STORE, node))


def _record_states(states: dict[int, str]) -> set[tuple[str, str]]:
    """Write the targets' states that changed; the (namespace, name) of the prefetches concerned."""
    current = PrefetchTarget.objects.filter(pk__in=list(states)).values_list(
        "pk", "state", "prefetch__namespace", "prefetch__name"
    )
    by_state, touched = defaultdict(list), set()
    for pk, state, namespace, name in current:
        if states[pk] != state:
            by_state[states[pk]].append(pk)
            touched.add((namespace, name))
    for state, pks in by_state.items():
        PrefetchTarget.objects.filter(pk__in=pks).update(state=state)
    return touched


def _annotated_int(annotations: dict, key: str, default: int, minimum: int, maximum: int = MAX_BYTES_PER_SECOND) -> int:
    """The integer a Node's annotation ``key`` gives, ``default`` without one; a value that is not an integer
    or lies outside ``[minimum, maximum]`` is ignored (logged), so no annotation can make the apply fail."""
    raw = annotations.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        log.warning("ignoring annotation %s=%r: not an integer", key, raw)
        return default
    if not minimum <= value <= maximum:
        log.warning("ignoring annotation %s=%r: not between %d and %d", key, raw, minimum, maximum)
        return default
    return value


def hub_spec() -> dict:
    hub = {}
    if settings.HF_ENDPOINT:
        hub["huggingFaceEndpoint"] = settings.HF_ENDPOINT
    if settings.MODELSCOPE_ENDPOINT:
        hub["modelScopeEndpoint"] = settings.MODELSCOPE_ENDPOINT
    if settings.HUB_PROXY:
        hub["proxy"] = settings.HUB_PROXY
    return hub


def upload_spec(annotations: dict) -> dict:
    """The peer endpoints' upload limits of a Node: the settings, or its own annotations
    (``worker.gpustack.ai/upload-connections``, ``worker.gpustack.ai/upload-bytes-per-second``)."""
    connections = _annotated_int(
        annotations, UPLOAD_CONNECTIONS_ANNOTATION, settings.UPLOAD_CONNECTIONS, 1, MAX_UPLOAD_CONNECTIONS
    )
    rate = _annotated_int(annotations, UPLOAD_BYTES_PER_SECOND_ANNOTATION, settings.UPLOAD_BYTES_PER_SECOND, 0)
    return {"connections": connections, "bytesPerSecond": rate}


def store_spec(annotations: dict, models: list[dict]) -> dict:
    """A store's spec holding ``models``, with the limits of its Node's ``annotations``: a Node may carry its
    own (``worker.gpustack.ai/download-bytes-per-second``, ``worker.gpustack.ai/download-concurrency``, and
    the upload ones of ``upload_spec``)."""
    concurrency = _annotated_int(
        annotations, CONCURRENCY_ANNOTATION, settings.DOWNLOAD_CONCURRENCY, 1, MAX_DOWNLOAD_CONCURRENCY
    )
    rate = _annotated_int(annotations, BYTES_PER_SECOND_ANNOTATION, settings.DOWNLOAD_BYTES_PER_SECOND, 0)
    return {
        "watermarks": {"highPercent": settings.STORE_HIGH_PERCENT, "lowPercent": settings.STORE_LOW_PERCENT},
        "download": {"concurrency": concurrency, "bytesPerSecond": rate},
        "upload": upload_spec(annotations),
        "hub": hub_spec(),
        "models": models,
    }


def _owned_by(body: dict, owner: dict) -> bool:
    owners = (body.get("metadata") or {}).get("ownerReferences") or []
    return owner in [{k: o.get(k) for k in ("apiVersion", "kind", "name", "uid")} for o in owners]


def plan_models(node: str) -> list[dict]:
    """Decide ``node``'s spec.models from its references (the database only; nothing is applied yet), and
    tell the prefetches whose place on the node changed. Decisions for one node are serialised on its
    Node row, so two reconciles of a node never decide at once."""
    with transaction.atomic():
        list(Node.objects.select_for_update().filter(name=node).values_list("pk", flat=True))
        references, states = node_references(node, timezone.now())
        assignment = place(references, states, namespace_quotas(references))
        models = desired_models(node, assignment)
        touched = _record_states(assignment.states)
    for namespace, name in sorted(touched):
        send(RECONCILE_PREFETCH, namespace, name)
    return models


def reconcile_node_store(node: str) -> str:
    """Make ``node``'s NodeModelStore exist (while the node runs the plugin) with the computed spec."""
    node_row = Node.objects.filter(name=node).first()
    if node_row is None:
        # Not (yet) in the mirror: the informers list Pods and Nodes apart, so a plugin's Pod can come first.
        # Its holdings (graces, pins) stay for when the Node is mirrored.
        return "unknown-node"
    if node_row.deleted:
        Holding.objects.filter(node=node).delete()  # the node is gone, and its cache with it
        return "no-node"
    models = plan_models(node)  # also while its plugin is away: graces still run out
    if not PluginPod.objects.live().filter(node=node, ready=True).exists():
        return "no-plugin"
    spec = store_spec((node_row.body.get("metadata") or {}).get("annotations") or {}, models)
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
        kube.default().apply(store_path(node), body, field_manager=STORE_SPEC)
    except kube.Conflict as exc:
        if exc.being_deleted:
            return "terminating"  # recreated when the deletion event arrives
        raise
    return "applied"


# --- What the mirror's changes concern --------------------------------------------------------------------


@reacts_to(mirror.STORES)
def reconcile_and_roll_up(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A store gone or whose spec changed is reconciled; each digest whose entry changed is rolled up, and
    each the node reports that entered or left its spec.models (its entry starts or stops counting)."""
    if after is None or (before or {}).get("spec") != after.get("spec"):
        enqueue(RECONCILE_NODE_STORE, name)
    old, new = mirror.entries_of(before), mirror.entries_of(after)
    placed = mirror.spec_digests(before) ^ mirror.spec_digests(after)
    for digest in sorted(d for d in set(old) | set(new) if old.get(d) != new.get(d) or d in placed):
        enqueue(ROLLUP_DIGEST, digest)


@reacts_to(mirror.NAMESPACES)
def namespace_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A namespace's share of the nodes changed (``budgets.SHARE_ANNOTATIONS``): the nodes its prefetches
    target are placed again; when its pinning did, its prefetches' status tells it anew."""
    old, new = (((b or {}).get("metadata") or {}).get("annotations") or {} for b in (before, after))
    changed = {key for key in SHARE_ANNOTATIONS if old.get(key) != new.get(key)}
    if not changed:
        return
    nodes = PrefetchTarget.objects.filter(prefetch__namespace=name).values_list("node", flat=True)
    for node in sorted(set(nodes)):
        enqueue(RECONCILE_NODE_STORE, node)
    if PINNING_ALLOWED_ANNOTATION in changed:
        for prefetch in Prefetch.objects.live().filter(namespace=name).values_list("name", flat=True):
            enqueue(RECONCILE_PREFETCH, name, prefetch)
