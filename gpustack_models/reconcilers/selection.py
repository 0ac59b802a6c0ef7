"""Which nodes each ModelPrefetch targets, kept as ``PrefetchTarget`` rows (one per prefetch and node).

A prefetch targets the nodes it names (``nodeNames``, whether or not they exist: a missing one is reported
``NodeNotFound``) or the nodes running the plugin whose labels its ``nodeSelector`` matches. The rows are
recomputed when the prefetch changes (``retarget_prefetch``) and when a node's labels change, a node
appears or goes, or its plugin starts or stops (``retarget_node``). A node's reconcile then reads only
the rows of that node: its cost follows the prefetches that target it, not the number of prefetches.
"""

from __future__ import annotations

import logging

from django.db import transaction

from gpustack_models.informers import mirror
from gpustack_models.informers.reactions import enqueue, reacts_to
from gpustack_models.kinds.placement_labels import is_placement_label
from gpustack_models.models import Node, PluginPod, Prefetch, PrefetchTarget
from gpustack_models.reconcilers.task_names import RECONCILE_NODE_STORE, RETARGET_NODE, RETARGET_PREFETCH

log = logging.getLogger(__name__)


def _requirement_holds(requirement: dict, labels: dict) -> bool:
    key, operator = requirement.get("key", ""), requirement.get("operator", "")
    values = requirement.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False  # an unknown operator selects nothing (the schema admits only the four above)


def selector_matches(selector: dict | None, labels: dict) -> bool:
    """A Kubernetes label selector (``matchLabels`` and ``matchExpressions``, all of which must hold)
    against a node's labels. An empty selector matches every node, as in Kubernetes."""
    selector = selector or {}
    labels = labels or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_requirement_holds(r, labels) for r in selector.get("matchExpressions") or [])


def plugin_nodes() -> set[str]:
    """Nodes whose plugin Pod is ready."""
    return set(PluginPod.objects.live().filter(ready=True).values_list("node", flat=True))


def selected_nodes(prefetch: Prefetch) -> set[str]:
    """The nodes ``prefetch`` targets now."""
    if prefetch.node_selector is None:
        return set(prefetch.node_names or [])
    running = plugin_nodes()
    return {
        name
        for name, labels in Node.objects.live().filter(name__in=running).values_list("name", "labels")
        if selector_matches(prefetch.node_selector, labels)
    }


def _generation(prefetch: Prefetch) -> int:
    return (prefetch.body.get("metadata") or {}).get("generation") or 0


def retarget_prefetch(namespace: str, name: str) -> set[str]:
    """Make the prefetch's target rows match what it selects now; the nodes whose reconcile it concerns
    (every node it targeted before or targets now: its spec may have changed more than its targets)."""
    with transaction.atomic():
        prefetch = Prefetch.objects.select_for_update().filter(namespace=namespace, name=name).first()
        if prefetch is None:
            return set()
        existing = {t.node: t for t in PrefetchTarget.objects.filter(prefetch=prefetch)}
        wanted = set() if prefetch.deleted else selected_nodes(prefetch)
        generation = _generation(prefetch)
        gone = [t.pk for node, t in existing.items() if node not in wanted]
        PrefetchTarget.objects.filter(pk__in=gone).delete()
        PrefetchTarget.objects.bulk_create(
            [PrefetchTarget(prefetch=prefetch, node=n, generation=generation) for n in wanted - set(existing)],
            ignore_conflicts=True,
        )
        # A changed spec starts the retention over: an earlier lapse does not carry into it.
        PrefetchTarget.objects.filter(prefetch=prefetch).exclude(generation=generation).update(
            generation=generation, lapsed_at=None
        )
    added, removed = wanted - set(existing), set(existing) - wanted
    if added or removed:
        log.info("prefetch %s/%s targets %d nodes (+%d, -%d)", namespace, name, len(wanted), len(added), len(removed))
    return wanted | set(existing)


def retarget_node(node: str) -> set[tuple[str, str]]:
    """Re-evaluate every label-selecting prefetch against ``node`` (its labels changed, it appeared or went,
    or its plugin started or stopped); the (namespace, name) of the prefetches whose targets changed."""
    row = Node.objects.live().filter(name=node).first()
    eligible = row is not None and PluginPod.objects.live().filter(node=node, ready=True).exists()
    labels = row.labels if row is not None else {}
    targeted = set(PrefetchTarget.objects.filter(node=node).values_list("prefetch_id", flat=True))
    changed = set()
    selecting = Prefetch.objects.live().filter(node_selector__isnull=False)
    for prefetch in selecting.only("id", "namespace", "name", "node_selector", "body").iterator():
        wants = eligible and selector_matches(prefetch.node_selector, labels)
        if wants == (prefetch.id in targeted):
            continue
        _set_target(prefetch, node, wants)
        changed.add((prefetch.namespace, prefetch.name))
    if changed:
        log.info("node %s: %d label-selecting prefetches now target it differently", node, len(changed))
    return changed


def _set_target(prefetch: Prefetch, node: str, wants: bool) -> None:
    """Add or remove the row of ``prefetch`` on ``node`` under the prefetch row's lock, which
    ``retarget_prefetch`` takes first too: both lock in the same order, so they never deadlock (an insert
    here waiting on the prefetch's lock while ``retarget_prefetch`` waits on this insert's key)."""
    with transaction.atomic():
        if not list(Prefetch.objects.select_for_update().filter(pk=prefetch.pk).values_list("pk", flat=True)):
            return
        if wants:
            PrefetchTarget.objects.get_or_create(
                prefetch=prefetch, node=node, defaults={"generation": _generation(prefetch)}
            )
        else:
            PrefetchTarget.objects.filter(prefetch=prefetch, node=node).delete()


# --- What the mirror's changes concern --------------------------------------------------------------------


@reacts_to(mirror.PREFETCHES)
def prefetch_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A new, changed or deleted spec retargets the prefetch (which reconciles its nodes); a status
    written by the service itself concerns nobody."""
    if before is not None and after is not None and before.get("spec") == after.get("spec"):
        return
    enqueue(RETARGET_PREFETCH, namespace, name)


def _labels(body: dict | None) -> dict | None:
    """A Node's labels a prefetch may select on: the placement labels the service writes are left out
    (their changes retarget nothing)."""
    if body is None:
        return None
    labels = (body.get("metadata") or {}).get("labels") or {}
    return {k: v for k, v in labels.items() if not is_placement_label(k)}


@reacts_to(mirror.NODES)
def node_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A node that appears, goes or changes labels is re-evaluated against every label selector."""
    if _labels(before) != _labels(after):
        enqueue(RETARGET_NODE, name)
    else:
        enqueue(RECONCILE_NODE_STORE, name)


@reacts_to(mirror.PODS)
def plugin_pod_changed(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """A plugin that starts or stops on a node makes the node selectable, or not."""
    nodes = {(body or {}).get("spec", {}).get("nodeName") for body in (before, after)}
    for node in sorted(n for n in nodes if n):
        enqueue(RETARGET_NODE, node)
