"""ModelPrefetch status: how many of the nodes it names hold its artifact's content, and its conditions.

Available    enough nodes are ready (``minReady``, 0 meaning all)
Progressing  some named node is not ready yet (or the artifact is missing or unresolved)
Degraded     some named node failed (reason: the most common failure reason)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpustack_models.models import Artifact, ConditionStatus, EntryState, Prefetch, StoreEntry

from .rollup import digest_counts
from .writes import PREFETCHER, apply_status, condition, prefetch_path

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE


def prefetches_of_digest(digest: str) -> list[Prefetch]:
    artifacts = set(Artifact.objects.live().filter(digest=digest).values_list("namespace", "name"))
    return [p for p in Prefetch.objects.live() if (p.namespace, p.artifact_name) in artifacts]


@dataclass
class PrefetchState:
    """What the mirror says of one prefetch's nodes."""

    prefetch: Prefetch
    artifact: Artifact | None
    nodes: list[str]
    counts: dict = field(default_factory=lambda: {"ready": 0, "downloading": 0, "failed": 0})
    failures: Counter = field(default_factory=Counter)

    @classmethod
    def read(cls, prefetch: Prefetch) -> PrefetchState:
        artifact = Artifact.objects.live().filter(namespace=prefetch.namespace, name=prefetch.artifact_name).first()
        state = cls(prefetch, artifact, list(prefetch.node_names or []))
        if state.digest:
            state.counts = digest_counts(state.digest, state.nodes)
            failed = StoreEntry.objects.filter(digest=state.digest, node__in=state.nodes, state=EntryState.FAILED)
            state.failures = Counter(failed.values_list("reason", flat=True))
        return state

    @property
    def digest(self) -> str:
        return self.artifact.digest if self.artifact else ""

    @property
    def desired(self) -> int:
        return len(self.nodes)

    @property
    def needed(self) -> int:
        return self.prefetch.min_ready or self.desired

    def waiting(self) -> tuple[str, str] | None:
        """Why nothing can be downloaded yet, if so: (reason, message)."""
        name = self.prefetch.artifact_name
        if self.artifact is None:
            return "ArtifactNotFound", f"ModelArtifact {name!r} does not exist"
        if not self.digest:
            return "ArtifactNotResolved", f"ModelArtifact {name!r} is not resolved yet"
        return None

    def conditions(self, previous: dict, generation: int) -> list[dict]:
        ready, desired, waiting = self.counts["ready"], self.desired, self.waiting()
        available = bool(self.digest) and desired > 0 and ready >= self.needed
        progressing = bool(self.digest) and ready < desired
        if waiting:
            available_reason, available_message = waiting
        else:
            available_reason = "MinimumReady" if available else "NotEnoughReady"
            available_message = f"{ready} of {desired} nodes ready ({self.needed} needed)"
        progress_reason = "Downloading" if progressing else ("Complete" if self.digest else waiting[0])
        failed = sum(self.failures.values())
        degraded_reason = self.failures.most_common(1)[0][0] if failed else "AsExpected"
        return [
            condition("Available", TRUE if available else FALSE, available_reason, available_message,
                      previous.get("Available"), generation),
            condition("Progressing", TRUE if progressing else FALSE, progress_reason,
                      f"{self.counts['downloading']} downloading, {ready} ready of {desired}",
                      previous.get("Progressing"), generation),
            condition("Degraded", TRUE if failed else FALSE, degraded_reason,
                      f"{failed} nodes failed" if failed else "no node failed",
                      previous.get("Degraded"), generation),
        ]  # fmt: skip


def reconcile_prefetch(namespace: str, name: str) -> bool:
    """Write the prefetch's status when it changed; True if written."""
    prefetch = Prefetch.objects.live().filter(namespace=namespace, name=name).first()
    if prefetch is None:
        return False
    state = PrefetchState.read(prefetch)
    generation = (prefetch.body.get("metadata") or {}).get("generation") or 0
    previous = {c.get("type"): c for c in (prefetch.status or {}).get("conditions") or []}
    status = {
        "observedGeneration": generation,
        "desiredNodes": state.desired,
        "readyNodes": state.counts["ready"],
        "downloadingNodes": state.counts["downloading"],
        "conditions": state.conditions(previous, generation),
    }
    if same_status(prefetch.status or {}, status):
        return False
    metadata = {"name": name, "namespace": namespace, "uid": prefetch.uid}
    return apply_status(prefetch_path(namespace, name), "ModelPrefetch", metadata, status, PREFETCHER)


def _summary(conditions: list[dict]) -> list[tuple]:
    return sorted((c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in conditions)


def same_status(old: dict, new: dict) -> bool:
    keys = ("observedGeneration", "desiredNodes", "readyNodes", "downloadingNodes")
    if any(old.get(k) != new.get(k) for k in keys):
        return False
    return _summary(old.get("conditions") or []) == _summary(new["conditions"])
