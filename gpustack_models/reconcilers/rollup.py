"""The artifacts' ``status.nodes`` and their ``Degraded`` and ``Ready`` conditions, from the entries of their
digest on every node (``Ready``: ``readiness``).

``status.nodes`` (how many nodes hold, download or failed the digest) is written on thresholds: a count
changes, or the mean percent crosses a 5 % step; ``progress`` is the exact answer. ``Degraded`` is True
while some node reports the digest ``Failed``: its reason is the commonest failure reason, its message
counts nodes per reason (never naming one); it clears when no node fails.
"""

from __future__ import annotations

from collections import Counter

from gpustack_models.models import Artifact, ConditionStatus, EntryState, StoreEntry
from gpustack_models.reconcilers import events, readiness
from gpustack_models.reconcilers.writes import ROLLUP, apply_status, artifact_path, condition, find_condition

COUNTS = ("ready", "downloading", "failed")
_COUNTED_AS = {EntryState.READY: "ready", EntryState.DOWNLOADING: "downloading", EntryState.FAILED: "failed"}


def digest_counts(digest: str, nodes: list[str] | None = None) -> dict:
    """Counts over the entries of ``digest`` (optionally on some nodes only) on the nodes it was placed on."""
    entries = StoreEntry.objects.claimed().filter(digest=digest)
    if nodes is not None:
        entries = entries.filter(node__in=nodes)
    out = {"ready": 0, "downloading": 0, "failed": 0}
    percents = []
    for state, size, done in entries.values_list("state", "size_bytes", "downloaded_bytes"):
        if state == EntryState.DOWNLOADING:
            percents.append(min(100, int(done * 100 / size)) if size else 0)
        key = _COUNTED_AS.get(state)
        if key:
            out[key] += 1
    if percents:
        out["downloadingPercent"] = int(sum(percents) / len(percents))
    return out


def failure_reasons(digest: str) -> Counter:
    failed = StoreEntry.objects.claimed().filter(digest=digest, state=EntryState.FAILED)
    return Counter(failed.values_list("reason", flat=True))


def nodes_changed(old: dict, new: dict) -> bool:
    """Counts change, or the mean percent crosses a 5 % step (or appears/disappears)."""
    if any((old.get(k) or 0) != new.get(k, 0) for k in COUNTS):
        return True
    if ("downloadingPercent" in old) != ("downloadingPercent" in new):
        return True
    if "downloadingPercent" in new:
        return old["downloadingPercent"] // 5 != new["downloadingPercent"] // 5
    return False


def degraded_of(counts: dict, reasons: Counter) -> tuple[str, str, str]:
    """(status, reason, message) of the ``Degraded`` condition."""
    failed = sum(reasons.values())
    if not failed:
        return ConditionStatus.FALSE, "AsExpected", "no node reports a failure"
    wanting = counts["ready"] + counts["downloading"] + counts["failed"]
    detail = ", ".join(f"{reason or 'Unknown'}: {count}" for reason, count in reasons.most_common())
    return (
        ConditionStatus.TRUE,
        reasons.most_common(1)[0][0] or "Unknown",
        f"{failed} of {wanting} nodes failed ({detail})",
    )


def _regarding(artifact: Artifact) -> dict:
    return events.regarding("ModelArtifact", artifact.name, artifact.uid, artifact.namespace)


def _write(artifact: Artifact, counts: dict, degraded: tuple[str, str, str], ready: tuple[str, str, str]) -> bool:
    previous, was_ready = find_condition(artifact.body, "Degraded"), find_condition(artifact.body, "Ready")
    generation = artifact.generation
    written = [
        condition("Degraded", *degraded, previous or None, generation),
        condition("Ready", *ready, was_ready or None, generation),
    ]
    status = {"nodes": counts, "conditions": written}
    metadata = {"name": artifact.name, "namespace": artifact.namespace, "uid": artifact.uid}
    if not apply_status(artifact_path(artifact.namespace, artifact.name), "ModelArtifact", metadata, status, ROLLUP):
        return False
    # Remember what was written so a burst of entry changes writes once per step. The apply merged the
    # conditions by type: so does the mirror's copy (Resolved stays).
    old = artifact.body.get("status") or {}
    kept = [c for c in old.get("conditions") or [] if isinstance(c, dict) and c.get("type") not in _MINE]
    body = dict(artifact.body, status=dict(old, nodes=counts, conditions=kept + written))
    Artifact.objects.filter(pk=artifact.pk).update(nodes=counts, body=body)
    _tell(artifact, previous, degraded, was_ready, ready)
    return True


_MINE = ("Degraded", "Ready")


def _tell(artifact: Artifact, previous: dict, degraded: tuple, was_ready: dict, ready: tuple) -> None:
    was = previous.get("status") == ConditionStatus.TRUE
    if degraded[0] == ConditionStatus.TRUE and (not was or previous.get("reason") != degraded[1]):
        events.record(_regarding(artifact), "Warning", "Degraded", degraded[2], series_key=degraded[1])
    elif was and degraded[0] != ConditionStatus.TRUE:
        events.record(_regarding(artifact), "Normal", "Recovered", "no node reports a failure any more")
    if ready[0] == ConditionStatus.TRUE and was_ready.get("status") != ConditionStatus.TRUE:
        events.record(_regarding(artifact), "Normal", "Ready", ready[2])


def _same(cond: dict, figures: tuple[str, str, str]) -> bool:
    return (cond.get("status"), cond.get("reason"), cond.get("message")) == figures


def rollup(digest: str) -> int:
    """Write ``status.nodes``, ``Degraded`` and ``Ready`` of every artifact with ``digest`` whose figures moved
    enough."""
    counts, reasons = digest_counts(digest), failure_reasons(digest)
    degraded = degraded_of(counts, reasons)
    artifacts = list(Artifact.objects.live().filter(digest=digest))
    wanted = readiness.wanted_nodes(artifacts, digest)
    states = dict(StoreEntry.objects.claimed().filter(digest=digest).values_list("node", "state"))
    written = 0
    for artifact in artifacts:
        ready = readiness.ready_of(wanted.get(artifact.namespace, set()), states)
        same = _same(find_condition(artifact.body, "Degraded"), degraded)
        if (
            same
            and _same(find_condition(artifact.body, "Ready"), ready)
            and not nodes_changed(artifact.nodes or {}, counts)
        ):
            continue
        written += _write(artifact, counts, degraded, ready)
    return written
