"""The artifacts' ``status.nodes``: how many nodes hold, download or failed their digest, written on
thresholds (a count changes, or the mean percent crosses a 5 % step); ``progress`` is the exact answer."""

from __future__ import annotations

from gpustack_models.models import Artifact, EntryState, StoreEntry

from .writes import ROLLUP, apply_status, artifact_path

COUNTS = ("ready", "downloading", "failed")
_COUNTED_AS = {EntryState.READY: "ready", EntryState.DOWNLOADING: "downloading", EntryState.FAILED: "failed"}


def digest_counts(digest: str, nodes: list[str] | None = None) -> dict:
    """Counts over the entries of ``digest`` (optionally on some nodes only)."""
    entries = StoreEntry.objects.filter(digest=digest, store__deleted=False)
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


def nodes_changed(old: dict, new: dict) -> bool:
    """Counts change, or the mean percent crosses a 5 % step (or appears/disappears)."""
    if any((old.get(k) or 0) != new.get(k, 0) for k in COUNTS):
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
        metadata = {"name": artifact.name, "namespace": artifact.namespace, "uid": artifact.uid}
        path = artifact_path(artifact.namespace, artifact.name)
        if not apply_status(path, "ModelArtifact", metadata, {"nodes": counts}, ROLLUP):
            continue
        # Remember what was written so a burst of entry changes writes once per step.
        Artifact.objects.filter(pk=artifact.pk).update(nodes=counts)
        written += 1
    return written
