"""Placement by Node labels (``GPUSTACK_PLACEMENT_MODE=nodeLabels``): each Node carries one label per
artifact whose digest it holds Ready (``kinds.placement_labels``), for the placement webhook to prefer.

Only claimed entries count (``StoreEntry.objects.claimed()``: a digest the service placed on the node), of
live, resolved artifacts that are downloaded (not claim-sourced), as the webhook's other mode counts them.
The labels are written by server-side apply under a field manager of their own (``FIELD_MANAGER``): it owns
exactly those labels, so an apply of the whole set adds and removes them and never touches another label.
Each write carries the mirrored Node's uid: a Node deleted meanwhile is never recreated by it.

What changes the labels of a node (a store's Ready entries or spec.models, an artifact's digest, a Node that
appears or whose placement labels were edited) enqueues one reconcile of that node per batch; Celery beat
compares every node's labels with what it holds every ``GPUSTACK_PLACEMENT_LABELS_RESYNC_SECONDS``. In any
other mode the desired set is empty: the same reconcile removes the labels left from the mode (the Node's
``patch`` right must then still be granted; without it the labels stay and a warning says so).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from django.conf import settings

from gpustack_models import kube
from gpustack_models.informers import mirror
from gpustack_models.informers.reactions import enqueue, reacts_to
from gpustack_models.kinds.placement_labels import LABEL_VALUE, label_key, placement_labels
from gpustack_models.models import Artifact, EntryState, Node, SourceKind, StoreEntry
from gpustack_models.reconcilers.task_names import RECONCILE_PLACEMENT_LABELS

log = logging.getLogger(__name__)

NODE_LABELS = "nodeLabels"
FIELD_MANAGER = "gpustack-models-placement-labels"
# At most this many placement labels on one Node (a Node's object stays small; the first by key are kept).
MAX_LABELS = 1000


def enabled() -> bool:
    return settings.PLACEMENT_MODE == NODE_LABELS


def desired_labels(nodes: list[str] | None = None) -> dict[str, dict[str, str]]:
    """node -> the placement labels it should carry (only nodes with one; none outside the mode)."""
    if not enabled():
        return {}
    entries = StoreEntry.objects.claimed().filter(state=EntryState.READY)
    if nodes is not None:
        entries = entries.filter(node__in=nodes)
    held = defaultdict(set)
    for node, digest in entries.values_list("node", "digest"):
        held[digest].add(node)
    artifacts = (
        Artifact.objects.live()
        .filter(digest__in=list(held))
        .exclude(source=SourceKind.CLAIM)
        .values_list("namespace", "name", "digest")
    )
    keys = defaultdict(set)
    for namespace, name, digest in artifacts:
        for node in held[digest]:
            keys[node].add(label_key(namespace, name))
    out = {}
    for node, node_keys in keys.items():
        if len(node_keys) > MAX_LABELS:
            log.warning("node %s holds %d artifacts: labelled with the first %d", node, len(node_keys), MAX_LABELS)
        out[node] = {key: LABEL_VALUE for key in sorted(node_keys)[:MAX_LABELS]}
    return out


def reconcile_placement_labels(node: str) -> str:
    """Make ``node``'s placement labels what it holds (none outside the mode)."""
    row = Node.objects.live().filter(name=node).first()
    if row is None:
        return "no-node"
    desired = desired_labels([node]).get(node, {})
    if placement_labels(row.labels) == desired:
        return "unchanged"
    try:
        _write(node, row.uid, desired)
    except (kube.NotFound, kube.Conflict, kube.Invalid):
        return "gone"  # deleted (or recreated: its event brings a reconcile of the new one)
    except kube.Forbidden:
        if enabled():
            raise
        kept = len(placement_labels(row.labels))
        log.warning("node %s keeps %d placement labels: the service may not patch Nodes", node, kept)
        return "forbidden"
    log.info("node %s: %d placement labels", node, len(desired))
    return "applied"


def _write(node: str, uid: str, desired: dict[str, str]) -> None:
    """Apply ``desired`` as the Node's placement labels; those of the prefix another writer set (which the
    apply does not own, so does not remove) are then removed by a merge patch."""
    client, path = kube.default(), f"/api/v1/nodes/{node}"
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": uid, "labels": desired}}
    applied = client.apply(path, body, field_manager=FIELD_MANAGER)
    foreign = set(placement_labels((applied.get("metadata") or {}).get("labels"))) - set(desired)
    if foreign:
        removal = {"metadata": {"uid": uid, "labels": dict.fromkeys(sorted(foreign))}}
        query = {"fieldManager": FIELD_MANAGER}
        client.json("PATCH", path, body=removal, query=query, content_type="application/merge-patch+json")


def out_of_date() -> list[str]:
    """The live nodes whose placement labels differ from what they hold (the periodic resync)."""
    desired = desired_labels()
    stale = []
    for name, labels in Node.objects.live().values_list("name", "labels"):
        if placement_labels(labels) != desired.get(name, {}):
            stale.append(name)
    return sorted(stale)


# --- What the mirror's changes concern --------------------------------------------------------------------


def _ready(body: dict | None) -> set[str]:
    return {d for d, e in mirror.entries_of(body).items() if e.get("state") == EntryState.READY}


@reacts_to(mirror.STORES)
def store_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A node's Ready digests, or those placed on it (whose entries count), changed."""
    if not enabled():
        return
    if _ready(before) != _ready(after) or mirror.spec_digests(before) != mirror.spec_digests(after):
        enqueue(RECONCILE_PLACEMENT_LABELS, name)


def _digest(body: dict | None) -> str:
    if body is None:
        return ""
    return ((body.get("status") or {}).get("resolved") or {}).get("manifestDigest", "")


@reacts_to(mirror.ARTIFACTS)
def artifact_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """An artifact that appears, goes or changes digest: the nodes holding either digest Ready."""
    if not enabled():
        return
    old, new = _digest(before), _digest(after)
    if old == new and (before is None) == (after is None):
        return
    digests = [d for d in {old, new} if d]
    nodes = StoreEntry.objects.claimed(digests).filter(digest__in=digests, state=EntryState.READY)
    for node in sorted(set(nodes.values_list("node", flat=True))):
        enqueue(RECONCILE_PLACEMENT_LABELS, node)


@reacts_to(mirror.NODES)
def node_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A Node that appears, or whose placement labels someone else changed."""
    if not enabled() or after is None:
        return
    labels = [placement_labels((body or {}).get("metadata", {}).get("labels")) for body in (before, after)]
    if before is None or labels[0] != labels[1]:
        enqueue(RECONCILE_PLACEMENT_LABELS, name)
