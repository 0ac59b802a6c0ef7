"""The collection pass (Celery beat, every ``GPUSTACK_COLLECTION_INTERVAL_SECONDS``): which nodes' spec.models
must change because time passed, not because an object did.

Two things happen by time alone: an unreferenced digest's grace ends (its ``Holding.collect_time``), and a
prefetch's ``retention.ttlAfterLastUse`` runs out since the content was last used on a node. The pass finds
those nodes with a few queries over the whole cluster and enqueues their reconciles; each reconcile makes
and logs the decision (``node_stores``, ``references``). It looks one interval ahead: a node whose time
comes before the next pass is reconciled at that moment (a task with an ETA), so a digest leaves the spec
at its ``collectTime``, not up to an interval later; the pass after it catches anything the ETA missed.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db.models import Min
from django.utils import timezone

from gpustack_models.models import Artifact, EntryState, Holding, PrefetchTarget, StoreEntry, TargetState

log = logging.getLogger(__name__)


def graces_ended(now: datetime) -> dict[str, datetime]:
    """Node -> the earliest end of a collection grace on it, for the graces ended by ``now``."""
    rows = Holding.objects.filter(collect_time__lte=now).values("node").annotate(at=Min("collect_time"))
    return {row["node"]: row["at"] for row in rows}


def _retained_targets():
    """Held targets of prefetches whose retention can run out."""
    return PrefetchTarget.objects.filter(
        state=TargetState.HELD,
        lapsed_at__isnull=True,
        prefetch__deleted=False,
        prefetch__pinned=False,
        prefetch__ttl_seconds__isnull=False,
    )


def retention_ended(now: datetime) -> dict[str, datetime]:
    """Node -> the earliest moment some prefetch's ``ttlAfterLastUse`` ran out on it since its content was
    last used, for those run out by ``now``."""
    targets = _retained_targets()
    shortest = targets.aggregate(ttl=Min("prefetch__ttl_seconds"))["ttl"]
    if shortest is None:
        return {}
    stale = {
        (node, digest): used
        for node, digest, used in StoreEntry.objects.filter(
            state=EntryState.READY, last_used_time__lt=now - timedelta(seconds=shortest)
        ).values_list("node", "digest", "last_used_time")
    }
    if not stale:
        return {}
    digests = {
        (ns, name): digest
        for ns, name, digest in Artifact.objects.live()
        .filter(digest__in={d for _, d in stale})
        .values_list("namespace", "name", "digest")
    }
    nodes: dict[str, datetime] = {}
    rows = targets.filter(node__in={n for n, _ in stale}).values_list(
        "node", "prefetch__namespace", "prefetch__artifact_name", "prefetch__ttl_seconds"
    )
    for node, namespace, artifact, ttl in rows.iterator():
        used = stale.get((node, digests.get((namespace, artifact), "")))
        if used is not None and now - used > timedelta(seconds=ttl):
            nodes[node] = min(nodes.get(node, now), used + timedelta(seconds=ttl))
    return nodes


def _earliest(*found: dict[str, datetime]) -> dict[str, datetime]:
    out: dict[str, datetime] = {}
    for nodes in found:
        for node, at in nodes.items():
            out[node] = min(out.get(node, at), at)
    return out


def collection_pass(now: datetime | None = None, ahead: float = 0.0) -> dict[str, datetime]:
    """Node -> when its spec.models changes because time passed: now or earlier for the nodes due, later
    (within ``ahead`` seconds) for those due before the next pass; the caller reconciles each at its time."""
    now = now or timezone.now()
    horizon = now + timedelta(seconds=ahead)
    ended, lapsed = graces_ended(horizon), retention_ended(horizon)
    due = _earliest(ended, lapsed)
    if due:
        log.info(
            "collection: %d nodes with a grace ending, %d with a retention running out, by %s",
            len(ended),
            len(lapsed),
            horizon.isoformat(timespec="seconds"),
        )
    return due
