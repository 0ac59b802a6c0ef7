"""A ModelArtifact's ``Ready`` condition: the one place that decides it.

``Ready`` is True once the artifact's content is Ready on at least one node that its own namespace asks for
it on: a node a ModelPrefetch of the namespace targets (and has not lapsed on), or a node where a Pod of the
namespace mounts it. That is what ``kubectl wait --for=condition=Ready mart/NAME`` waits for. The
namespace's artifacts with the same content share the nodes: a prefetch of ``a`` makes ``b`` Ready when both
resolved to one digest.

It is not the ``READY`` column: ``status.nodes.ready`` counts every node holding the digest, whichever
namespace placed it there (content is shared across namespaces by digest; a tenant never learns which). A
copy on a node only another namespace asked for makes the count move, never the condition.

A claim source (a PersistentVolumeClaim) is Ready when resolved: its files are the claim's, nothing is
downloaded. Before its first resolution an artifact has no ``Ready`` condition; the ``Resolved`` one says
what happens.
"""

from __future__ import annotations

from collections import defaultdict

from gpustack_models.models import Artifact, ConditionStatus, EntryState, MountReference, PrefetchTarget, TargetState

ASKING = "this namespace asks for it on (its ModelPrefetches and the Pods that mount it)"


def wanted_nodes(artifacts: list[Artifact], digest: str) -> dict[str, set[str]]:
    """Namespace -> the nodes it asks for ``digest`` on, from ``artifacts`` (those resolved to it)."""
    names = defaultdict(set)
    for artifact in artifacts:
        names[artifact.namespace].add(artifact.name)
    if not names:
        return {}
    out: dict[str, set[str]] = {namespace: set() for namespace in names}
    targets = (
        PrefetchTarget.objects.filter(
            prefetch__deleted=False,
            prefetch__namespace__in=list(names),
            prefetch__artifact_name__in={n for group in names.values() for n in group},
        )
        .exclude(state=TargetState.LAPSED)
        .values_list("prefetch__namespace", "prefetch__artifact_name", "node")
    )
    for namespace, name, node in targets:
        if name in names[namespace]:
            out[namespace].add(node)
    mounts = MountReference.objects.filter(
        pod_namespace__in=list(names), artifact__in={n for group in names.values() for n in group}, digest=digest
    ).values_list("pod_namespace", "artifact", "node")
    for namespace, name, node in mounts:
        if name in names[namespace]:
            out[namespace].add(node)
    return out


def ready_of(wanted: set[str], states: dict[str, str]) -> tuple[str, str, str]:
    """(status, reason, message) of ``Ready`` for a namespace asking for the nodes ``wanted``, the digest's
    entries being ``states`` (node -> state, every node)."""
    if not wanted:
        return (
            ConditionStatus.FALSE,
            "NotRequested",
            "no ModelPrefetch or Pod of this namespace asks for it on any node: create a ModelPrefetch "
            "(or a Pod that mounts it) to download it",
        )
    mine = [states.get(node) for node in wanted]
    ready = mine.count(EntryState.READY)
    if ready:
        return ConditionStatus.TRUE, "Ready", f"ready on {ready} of {_nodes(len(wanted))}"
    downloading, failed = mine.count(EntryState.DOWNLOADING), mine.count(EntryState.FAILED)
    if downloading:
        reason = "Downloading"
    elif failed:
        reason = "Failed"
    else:
        reason = "Pending"
    detail = f"{downloading} downloading, {failed} failed" + (" (see Degraded)" if failed else "")
    return ConditionStatus.FALSE, reason, f"not ready yet on any of {_nodes(len(wanted))}: {detail}"


def _nodes(count: int) -> str:
    return f"{count} {'node' if count == 1 else 'nodes'} {ASKING}"


def claim_ready() -> tuple[str, str, str]:
    return ConditionStatus.TRUE, "ClaimSource", "its files are the PersistentVolumeClaim's: nothing to download"
