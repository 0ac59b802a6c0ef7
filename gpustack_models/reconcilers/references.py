"""The reference model: the one place that decides which digests a node is asked to hold.

A digest is *referenced* on a node while something wants it there: a ModelPrefetch that targets the
node (``targets``), its artifact resolved, and not lapsed (``retention.ttlAfterLastUse`` past since the
content was last used on that node ends the prefetch's reference there; ``pinned`` never lapses, where
an administrator allows the namespace to pin: elsewhere a pinned prefetch is treated as unpinned); or a
Pod's volume on the node that mounts it (a ``MountReference``, until the volume is released or the Pod is
gone: mounts never lapse and no namespace limit applies to them). Each reference carries what ordering
and limits need: its namespace and the content's size (for the namespace's per-node limits), whether
it is pinned or a mount, and when it began.

``place`` turns a node's references into the digests its ``spec.models`` holds: first each namespace's
share (``budgets.Share``: bytes and distinct digests per node; ``QuotaExceeded`` past either), then the
per-node cap (``GPUSTACK_MODELS_PER_NODE``: 256 digests, the schema's limit, unless set lower), keeping
mounted, then pinned, then the oldest references (``NodeFull`` for the rest): a Pod's mount is never left
out for a prefetch, and one namespace's prefetches cannot take more than its share of a node's places.
Every reference left out is told why through its ``PrefetchTarget`` state, which the prefetch's status
reports.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings

from gpustack_models.models import (
    Artifact,
    EntryState,
    MountReference,
    PrefetchTarget,
    SourceKind,
    StoreEntry,
    TargetState,
)
from gpustack_models.reconcilers.budgets import Share, namespace_limits

log = logging.getLogger(__name__)

MAX_MODELS = 256  # the schema's limit of spec.models: GPUSTACK_MODELS_PER_NODE may not exceed it
_EPOCH = datetime.min.replace(tzinfo=UTC)


def models_per_node() -> int:
    """The per-node cap: ``GPUSTACK_MODELS_PER_NODE`` (at most ``MAX_MODELS``, refused at start past it)."""
    return settings.MODELS_PER_NODE


@dataclass(frozen=True)
class Reference:
    """One reason for ``digest`` to be on a node."""

    digest: str
    namespace: str
    size_bytes: int
    since: datetime  # when the reference began: older ones win under the cap
    pinned: bool = False
    mounted: bool = False
    target_id: int | None = None  # the PrefetchTarget behind a prefetch's reference


@dataclass
class Assignment:
    """What a node holds: ``held`` digest -> pinned; ``states``: PrefetchTarget id -> its state."""

    held: dict[str, bool] = field(default_factory=dict)
    states: dict[int, str] = field(default_factory=dict)


def _artifacts_of(targets: list[PrefetchTarget]) -> dict[tuple[str, str], Artifact]:
    keys = {(t.prefetch.namespace, t.prefetch.artifact_name) for t in targets}
    if not keys:
        return {}
    rows = (
        Artifact.objects.live()
        .filter(namespace__in={ns for ns, _ in keys}, name__in={name for _, name in keys})
        .only("namespace", "name", "digest", "size_bytes", "source")
    )
    return {(a.namespace, a.name): a for a in rows if (a.namespace, a.name) in keys}


def _last_used(node: str) -> dict[str, datetime | None]:
    """Ready digests of ``node`` and when each was last used."""
    rows = StoreEntry.objects.claimed().filter(node=node, state=EntryState.READY)
    return dict(rows.values_list("digest", "last_used_time"))


def _lapses(target: PrefetchTarget, digest: str, used: dict, now: datetime, pinned: bool) -> bool:
    """True once the prefetch's retention has run out on this node (remembered: a lapse stays until the
    prefetch's spec changes). Never for a prefetch kept ``pinned`` or one without ``ttlAfterLastUse``."""
    prefetch = target.prefetch
    if pinned or prefetch.ttl_seconds is None:
        return False
    if target.lapsed_at is not None:
        return True
    last = used.get(digest)
    if last is None or now - last <= timedelta(seconds=prefetch.ttl_seconds):
        return False
    target.lapsed_at = now
    PrefetchTarget.objects.filter(pk=target.pk).update(lapsed_at=now)
    log.info(
        "node %s: %s of prefetch %s/%s lapsed: unused since %s (ttlAfterLastUse %ss)",
        target.node, digest[:19], prefetch.namespace, prefetch.name, last.isoformat(), f"{prefetch.ttl_seconds:g}",
    )  # fmt: skip
    return True


def prefetch_references(node: str, now: datetime) -> tuple[list[Reference], dict[int, str]]:
    """The prefetches' references to ``node``, and the states of the targets that make none (their
    artifact missing, unresolved or a claim: ``Pending``; retention run out: ``Lapsed``). A prefetch pins
    only where its namespace may (``budgets.Share.pinning``)."""
    targets = list(
        PrefetchTarget.objects.filter(node=node, prefetch__deleted=False)
        .select_related("prefetch")
        .only(
            "id", "node", "state", "lapsed_at",
            "prefetch__namespace", "prefetch__name", "prefetch__artifact_name", "prefetch__pinned",
            "prefetch__ttl_seconds", "prefetch__created_at",
        )
    )  # fmt: skip
    artifacts, used = _artifacts_of(targets), _last_used(node)
    pinning = {ns for ns, share in namespace_limits({t.prefetch.namespace for t in targets}).items() if share.pinning}
    references, states = [], {}
    for target in targets:
        prefetch = target.prefetch
        artifact = artifacts.get((prefetch.namespace, prefetch.artifact_name))
        pinned = prefetch.pinned and prefetch.namespace in pinning
        if artifact is None or not artifact.digest or artifact.source == SourceKind.CLAIM:
            states[target.pk] = TargetState.PENDING
        elif _lapses(target, artifact.digest, used, now, pinned):
            states[target.pk] = TargetState.LAPSED
        else:
            since = prefetch.created_at or _EPOCH
            references.append(
                Reference(artifact.digest, prefetch.namespace, artifact.size_bytes or 0, since, pinned,
                          target_id=target.pk)
            )  # fmt: skip
    return references, states


def mount_references(node: str) -> list[Reference]:
    """The references of the Pods' volumes on ``node`` that mount a model: one per volume."""
    rows = MountReference.objects.filter(node=node).values_list("digest", "pod_namespace", "size_bytes", "created_at")
    return [Reference(digest, ns, size, since, mounted=True) for digest, ns, size, since in rows]


def node_references(node: str, now: datetime) -> tuple[list[Reference], dict[int, str]]:
    """Every reference to ``node`` (see the module's docstring), and the states of targets that make none."""
    references, states = prefetch_references(node, now)
    return references + mount_references(node), states


def namespace_quotas(references: list[Reference]) -> dict[str, Share]:
    """The share of one node each namespace with a prefetch reference has (``budgets.namespace_limits``)."""
    return namespace_limits({r.namespace for r in references if not r.mounted})


def priority(ref: Reference) -> tuple:
    """The order in which references take places (the smallest first): mounts, then pinned prefetches,
    then the oldest; the digest last, so equal references order the same on every reconcile."""
    return (not ref.mounted, not ref.pinned, ref.since, ref.digest)


def _exceeds(share: Share, spent: int, counted: set[str], ref: Reference) -> bool:
    """Whether ``ref`` takes its namespace past its share, which has ``spent`` bytes on ``counted``."""
    if ref.digest in counted:
        return False
    over_bytes = share.bytes and spent + ref.size_bytes > share.bytes
    return bool(over_bytes or (share.digests and len(counted) >= share.digests))


def within_quotas(references: list[Reference], states: dict[int, str], quotas: dict[str, Share]) -> list[Reference]:
    """The references each namespace's share admits (pinned, then oldest first); the others are marked
    ``QuotaExceeded``. A digest counts once per namespace; mounts are not limited."""
    admitted, spent, counted = [], defaultdict(int), defaultdict(set)
    for ref in sorted(references, key=priority):
        if ref.mounted:
            admitted.append(ref)
            continue
        if _exceeds(quotas.get(ref.namespace) or Share(), spent[ref.namespace], counted[ref.namespace], ref):
            if ref.target_id is not None:
                states[ref.target_id] = TargetState.QUOTA_EXCEEDED
            continue
        if ref.digest not in counted[ref.namespace]:
            spent[ref.namespace] += ref.size_bytes
            counted[ref.namespace].add(ref.digest)
        admitted.append(ref)
    return admitted


def place(
    references: list[Reference], states: dict[int, str], quotas: dict[str, Share], cap: int | None = None
) -> Assignment:
    """The digests a node holds from its references (see the module's docstring); ``quotas``: each
    namespace's share (absent: no limit); ``cap``: the per-node cap (default: ``models_per_node()``)."""
    cap = models_per_node() if cap is None else cap
    assignment = Assignment(states=states)
    admitted = within_quotas(references, assignment.states, quotas)
    for ref in sorted(admitted, key=priority):
        if ref.digest in assignment.held or len(assignment.held) < cap:
            assignment.held[ref.digest] = assignment.held.get(ref.digest, False) or ref.pinned
            state = TargetState.HELD
        else:
            state = TargetState.NODE_FULL
        if ref.target_id is not None:
            assignment.states[ref.target_id] = state
    return assignment
