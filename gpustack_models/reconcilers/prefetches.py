"""ModelPrefetch status: how many of the nodes it targets hold its artifact's content, and its conditions.

Available    enough targeted nodes are ready (``minReady``, 0 meaning all)
Progressing  some targeted node is still to get the content
Degraded     something stands in the way, with the commonest reason first: the artifact is missing, not
             resolvable or a claim; named nodes that do not exist or run no plugin; nodes that failed the
             download (their reasons); nodes full (``NodeFull``); the namespace's share of a node, bytes or
             digests (``QuotaExceeded``)
Lapsed       ``retention.ttlAfterLastUse`` ran out on some nodes: the content is collected there, those nodes
             count as ``lapsedNodes``, never as ready (even while the files wait out their grace), and where
             that is all that keeps the prefetch from Available or Complete, Available and Progressing say
             ``Lapsed`` with the way back (a change of the spec places it again), not a stall
Pinned       ``retention.pinned`` holds: True where the namespace may pin; ``PinningNotAllowed`` where it
             may not (an administrator's annotation on the Namespace): the prefetch is then kept unpinned

Messages count nodes and never name one, except a node the prefetch names itself that does not exist.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.db.models import Q

from gpustack_models.models import (
    Artifact,
    ConditionStatus,
    EntryState,
    Node,
    PluginPod,
    Prefetch,
    PrefetchTarget,
    SourceKind,
    StoreEntry,
    TargetState,
)
from gpustack_models.reconcilers import events
from gpustack_models.reconcilers.budgets import PINNING_ALLOWED_ANNOTATION, pinning_allowed
from gpustack_models.reconcilers.rollup import digest_counts
from gpustack_models.reconcilers.writes import PREFETCHER, apply_status, condition, find_condition, prefetch_path

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE
NODE_NOT_FOUND, PLUGIN_NOT_RUNNING = "NodeNotFound", "PluginNotRunning"
_EXPLAINED = {
    NODE_NOT_FOUND: "no such node",
    PLUGIN_NOT_RUNNING: "the node runs no model plugin",
    TargetState.NODE_FULL: "the node already holds the most models it may (GPUSTACK_MODELS_PER_NODE)",
    TargetState.QUOTA_EXCEEDED: "past the namespace's limit of bytes or models per node",
}
PINNING_NOT_ALLOWED = "PinningNotAllowed"
LAPSED = "Lapsed"
PLACE_AGAIN = "change the prefetch's spec (its retention, for example) to place it again"


def prefetches_of_digest(digest: str) -> list[tuple[str, str]]:
    """(namespace, name) of the prefetches of every artifact whose content is ``digest``."""
    artifacts = Artifact.objects.live().filter(digest=digest).values_list("namespace", "name")
    match = Q()
    for namespace, name in artifacts:
        match |= Q(namespace=namespace, artifact_name=name)
    if not match:
        return []
    return list(Prefetch.objects.live().filter(match).values_list("namespace", "name"))


@dataclass
class PrefetchState:
    """What the mirror says of one prefetch's nodes."""

    prefetch: Prefetch
    artifact: Artifact | None
    nodes: list[str]
    counts: dict = field(default_factory=lambda: {"ready": 0, "downloading": 0, "failed": 0})
    problems: Counter = field(default_factory=Counter)  # reason -> nodes
    missing: list[str] = field(default_factory=list)  # named nodes that do not exist
    lapsed_nodes: set[str] = field(default_factory=set)  # retention ran out there: not counted as ready
    pinning: bool = False  # whether the namespace may pin

    @property
    def lapsed(self) -> int:
        return len(self.lapsed_nodes)

    @classmethod
    def read(cls, prefetch: Prefetch) -> PrefetchState:
        artifact = Artifact.objects.live().filter(namespace=prefetch.namespace, name=prefetch.artifact_name).first()
        targets = dict(PrefetchTarget.objects.filter(prefetch=prefetch).values_list("node", "state"))
        state = cls(
            prefetch, artifact, sorted(targets), pinning=prefetch.pinned and pinning_allowed(prefetch.namespace)
        )
        state._read_nodes(targets)
        if state.digest:
            # A lapsed node's copy is on its way out (collected after the grace): it counts for nothing.
            live = [node for node in state.nodes if node not in state.lapsed_nodes]
            state.counts = digest_counts(state.digest, live)
            failed = StoreEntry.objects.claimed().filter(digest=state.digest, node__in=live, state=EntryState.FAILED)
            state.problems.update(failed.values_list("reason", flat=True))
        return state

    def _read_nodes(self, targets: dict[str, str]) -> None:
        existing = set(Node.objects.live().filter(name__in=self.nodes).values_list("name", flat=True))
        running = set(PluginPod.objects.live().filter(node__in=self.nodes, ready=True).values_list("node", flat=True))
        for node, target_state in targets.items():
            if node not in existing:
                self.missing.append(node)
                self.problems[NODE_NOT_FOUND] += 1
            elif node not in running:
                self.problems[PLUGIN_NOT_RUNNING] += 1
            elif target_state in (TargetState.NODE_FULL, TargetState.QUOTA_EXCEEDED):
                self.problems[target_state] += 1
            if target_state == TargetState.LAPSED:
                self.lapsed_nodes.add(node)

    @property
    def digest(self) -> str:
        if self.artifact is None or self.artifact.source == SourceKind.CLAIM:
            return ""
        return self.artifact.digest

    @property
    def desired(self) -> int:
        return len(self.nodes)

    @property
    def needed(self) -> int:
        return self.prefetch.min_ready or self.desired

    def waiting(self) -> tuple[str, str, bool] | None:
        """Why nothing can be placed yet, if so: (reason, message, whether it is a fault to report)."""
        name, artifact = self.prefetch.artifact_name, self.artifact
        if artifact is None:
            return "ArtifactNotFound", f"ModelArtifact {name!r} does not exist in this namespace", True
        if artifact.source == SourceKind.CLAIM:
            return (
                "UnsupportedSource",
                f"ModelArtifact {name!r} takes its files from a PersistentVolumeClaim; only Hugging Face and "
                "ModelScope sources are cached on nodes, so it cannot be prefetched",
                True,
            )
        if self.digest:
            return None
        resolved = find_condition(artifact.body, "Resolved")
        if resolved.get("status") == FALSE:
            reason = resolved.get("reason") or "ArtifactNotResolved"
            return reason, f"ModelArtifact {name!r} is not resolved: {resolved.get('message', '')}", True
        return "ArtifactNotResolved", f"ModelArtifact {name!r} is being resolved", False

    def degraded(self) -> tuple[str, str]:
        """(reason, message) when something stands in the way; ("", "") when nothing does."""
        waiting = self.waiting()
        if waiting and waiting[2]:
            return waiting[0], waiting[1]
        if not self.problems:
            return "", ""
        parts = []
        for reason, count in self.problems.most_common():
            detail = _EXPLAINED.get(reason, "the download failed")
            if reason == NODE_NOT_FOUND:
                detail = "no such node: " + ", ".join(sorted(self.missing)[:10])
            parts.append(f"{count} of {self.desired} nodes {reason} ({detail})")
        return self.problems.most_common(1)[0][0], "; ".join(parts)

    def conditions(self, previous: dict, generation: int) -> list[dict]:
        def cond(type_, ok, reason, message):
            return condition(type_, TRUE if ok else FALSE, reason, message, previous.get(type_), generation)

        return [
            cond("Available", *self._available()),
            cond("Progressing", *self._progressing()),
            cond("Degraded", *self._degraded()),
            cond("Lapsed", *self._lapsed()),
            cond("Pinned", *self._pinned()),
        ]

    def _available(self) -> tuple[bool, str, str]:
        ready, desired, waiting = self.counts["ready"], self.desired, self.waiting()
        if waiting:
            return False, waiting[0], waiting[1]
        if desired == 0:
            return False, "NoNodes", "no node running the model plugin is targeted"
        if self.lapsed and ready < self.needed and ready + self.lapsed >= self.needed:
            return False, LAPSED, f"{ready} of {desired} nodes ready, {self.lapsed} lapsed: {PLACE_AGAIN}"
        ok = ready >= self.needed
        return (
            ok,
            "MinimumReady" if ok else "NotEnoughReady",
            f"{ready} of {desired} nodes ready ({self.needed} needed)",
        )

    def _progressing(self) -> tuple[bool, str, str]:
        ready, downloading, desired = self.counts["ready"], self.counts["downloading"], self.desired
        blocked = sum(self.problems.values()) + self.lapsed
        message = f"{downloading} downloading, {ready} ready of {desired}"
        waiting = self.waiting()
        if waiting:
            return False, waiting[0], waiting[1]
        if ready + blocked < desired:
            return True, "Downloading", message
        if ready < desired and self.lapsed and ready + self.lapsed == desired:
            return False, LAPSED, f"{message}, {self.lapsed} lapsed: {PLACE_AGAIN}"
        return False, "Complete" if ready == desired and desired else "Stalled", message

    def _degraded(self) -> tuple[bool, str, str]:
        reason, message = self.degraded()
        return (True, reason, message) if reason else (False, "AsExpected", "nothing stands in the way")

    def _pinned(self) -> tuple[bool, str, str]:
        if not self.prefetch.pinned:
            return False, "NotRequested", "retention.pinned is not set"
        if self.pinning:
            return True, "Pinned", "kept regardless of disk pressure and retention while the prefetch exists"
        return (
            False,
            PINNING_NOT_ALLOWED,
            f"the namespace may not pin (the Namespace's annotation {PINNING_ALLOWED_ANNOTATION}, set by "
            "administrators): prefetched unpinned, so disk pressure may evict the content and "
            "retention.ttlAfterLastUse applies",
        )

    def _lapsed(self) -> tuple[bool, str, str]:
        if not self.lapsed:
            return False, "Retained", "retained on every targeted node"
        return (
            True,
            "TTLAfterLastUse",
            f"unused for longer than retention.ttlAfterLastUse on {self.lapsed} of {self.desired} nodes; "
            f"the content is collected there; {PLACE_AGAIN}",
        )


def reconcile_prefetch(namespace: str, name: str) -> bool:
    """Write the prefetch's status when it changed; True if written."""
    prefetch = Prefetch.objects.live().filter(namespace=namespace, name=name).first()
    if prefetch is None:
        return False
    state = PrefetchState.read(prefetch)
    generation = (prefetch.body.get("metadata") or {}).get("generation") or 0
    old = prefetch.status or {}
    previous = {c.get("type"): c for c in old.get("conditions") or []}
    status = {
        "observedGeneration": generation,
        "desiredNodes": state.desired,
        "readyNodes": state.counts["ready"],
        "downloadingNodes": state.counts["downloading"],
        "lapsedNodes": state.lapsed,
        "conditions": state.conditions(previous, generation),
    }
    if same_status(old, status):
        return False
    metadata = {"name": name, "namespace": namespace, "uid": prefetch.uid}
    written = apply_status(prefetch_path(namespace, name), "ModelPrefetch", metadata, status, PREFETCHER)
    if written:
        Prefetch.objects.filter(pk=prefetch.pk).update(status=status)
        record_transitions(prefetch, old, status)
    return written


def _summary(conditions: list[dict]) -> list[tuple]:
    return sorted((c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in conditions)


def same_status(old: dict, new: dict) -> bool:
    keys = ("observedGeneration", "desiredNodes", "readyNodes", "downloadingNodes")
    if any(old.get(k) != new.get(k) for k in keys):
        return False
    return _summary(old.get("conditions") or []) == _summary(new["conditions"])


def _became(old: dict, new: dict, type_: str) -> dict | None:
    """The new condition of ``type_`` if it turned True (or changed reason while True)."""
    before = {c.get("type"): c for c in old.get("conditions") or []}.get(type_) or {}
    after = {c.get("type"): c for c in new.get("conditions") or []}.get(type_) or {}
    if after.get("status") != TRUE:
        return None
    if before.get("status") == TRUE and before.get("reason") == after.get("reason"):
        return None
    return after


def record_transitions(prefetch: Prefetch, old: dict, new: dict) -> None:
    """Events on the prefetch: targets changed, available, degraded (e.g. NodeFull), lapsed."""
    regarding = events.regarding("ModelPrefetch", prefetch.name, prefetch.uid, prefetch.namespace)
    if old.get("desiredNodes") != new["desiredNodes"]:
        was = old.get("desiredNodes")
        message = f"targets {new['desiredNodes']} nodes" + (f" (was {was})" if was is not None else "")
        events.record(regarding, "Normal", "TargetsChanged", message)
    for type_, kind, reason in (("Available", "Normal", "Available"), ("Lapsed", "Normal", "Lapsed")):
        changed = _became(old, new, type_)
        if changed:
            events.record(regarding, kind, reason, changed["message"])
    degraded = _became(old, new, "Degraded")
    if degraded:
        events.record(regarding, "Warning", degraded["reason"], degraded["message"], series_key=degraded["reason"])
    refused = {c.get("type"): c for c in new["conditions"]}.get("Pinned") or {}
    if refused.get("reason") == PINNING_NOT_ALLOWED and _reason(old, "Pinned") != PINNING_NOT_ALLOWED:
        events.record(regarding, "Warning", PINNING_NOT_ALLOWED, refused["message"])


def _reason(status: dict, type_: str) -> str:
    return ({c.get("type"): c for c in status.get("conditions") or []}.get(type_) or {}).get("reason") or ""
