"""The collection pass (Celery beat, every ``GPUSTACK_COLLECTION_INTERVAL_SECONDS``): which nodes' spec.models
must change because time passed, not because an object did.

Two things happen by time alone: an unreferenced digest's grace ends (its ``Holding.collect_time``), and a
prefetch's ``retention.ttlAfterLastUse`` runs out since the content was last used on a node. The pass finds
those nodes with a few queries over the whole cluster and enqueues their reconciles; each reconcile makes
and logs the decision (``node_stores``, ``references``).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db.models import Min
from django.utils import timezone

from gpustack_models.models import Artifact, EntryState, Holding, PrefetchTarget, StoreEntry, TargetState

log = logging.getLogger(__name__)


def graces_ended(now: datetime) -> set[str]:
    """Nodes holding a digest whose collection grace has ended."""
    return set(Holding.objects.filter(collect_time__lte=now).values_list("node", flat=True).distinct())


def _retained_targets():
    """Held targets of prefetches whose retention can run out."""
    return PrefetchTarget.objects.filter(
        state=TargetState.HELD,
        lapsed_at__isnull=True,
        prefetch__deleted=False,
        prefetch__pinned=False,
        prefetch__ttl_seconds__isnull=False,
    )


def retention_ended(now: datetime) -> set[str]:
    """Nodes where some prefetch's ``ttlAfterLastUse`` has run out since its content was last used."""
    targets = _retained_targets()
    shortest = targets.aggregate(ttl=Min("prefetch__ttl_seconds"))["ttl"]
    if shortest is None:
        return set()
    stale = {
        (node, digest): used
        for node, digest, used in StoreEntry.objects.filter(
            state=EntryState.READY, last_used_time__lt=now - timedelta(seconds=shortest)
        ).values_list("node", "digest", "last_used_time")
    }
    if not stale:
        return set()
    digests = {
        (ns, name): digest
        for ns, name, digest in Artifact.objects.live()
        .filter(digest__in={d for _, d in stale})
        .values_list("namespace", "name", "digest")
    }
    nodes = set()
    rows = targets.filter(node__in={n for n, _ in stale}).values_list(
        "node", "prefetch__namespace", "prefetch__artifact_name", "prefetch__ttl_seconds"
    )
    for node, namespace, artifact, ttl in rows.iterator():
        used = stale.get((node, digests.get((namespace, artifact), "")))
        if used is not None and now - used > timedelta(seconds=ttl):
            nodes.add(node)
    return nodes


def collection_pass(now: datetime | None = None) -> set[str]:
    """The nodes whose spec.models time has changed; the caller reconciles them."""
    now = now or timezone.now()
    ended, lapsed = graces_ended(now), retention_ended(now)
    if ended or lapsed:
        log.info("collection: %d nodes with a grace ended, %d with a retention run out", len(ended), len(lapsed))
    return ended | lapsed
