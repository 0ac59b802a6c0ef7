"""Kubernetes Events on NodeModelStores, for administrators, inferred from the store's status as mirrored.

The node plugin writes its store's status; the service, seeing one entry change between two mirrored
versions, records what happened to that digest on that node:

    DownloadStarted  (Normal)   an entry became Downloading
    DownloadReady    (Normal)   an entry became Ready
    DownloadFailed   (Warning)  an entry became Failed (or failed for another reason), with its reason and
                                message; one series per digest and reason, so the retries of one failing
                                download make one Event counting them
    Collected        (Normal)   an entry went away after its digest left spec.models
    Evicted          (Warning)  an entry went away while its digest was still in spec.models: the node
                                removed it under disk pressure

Each names the digest (short form) and its size. The Events are recorded by a task, off the mirror's path
(``record_entry_events``, a reaction to the mirror's NodeModelStores).
"""

from __future__ import annotations

from gpustack_models.informers import mirror
from gpustack_models.informers.reactions import reacts_to
from gpustack_models.informers.sending import send
from gpustack_models.kinds.formatting import human_bytes
from gpustack_models.reconcilers import events
from gpustack_models.reconcilers.events import NORMAL, WARNING
from gpustack_models.reconcilers.resolution import short_digest
from gpustack_models.reconcilers.task_names import RECORD_EVENTS

STATE_EVENTS = {
    "Downloading": (NORMAL, "DownloadStarted", "downloading {what}"),
    "Ready": (NORMAL, "DownloadReady", "{what} is ready"),
}


def _what(digest: str, entry: dict) -> str:
    size = entry.get("sizeBytes")
    return f"{short_digest(digest)} ({human_bytes(size)})" if size else f"{short_digest(digest)} (size unknown)"


def _changed(digest: str, old: dict, new: dict) -> list[str] | None:
    state, what = new.get("state"), _what(digest, new)
    if state == "Failed":
        reason = new.get("reason") or "Failed"
        if old.get("state") == "Failed" and old.get("reason") == new.get("reason"):
            return None
        message = f"{what}: {reason}: {new.get('message') or 'no message'}"
        return [WARNING, "DownloadFailed", message, f"{digest}/{reason}"]
    if state in STATE_EVENTS and old.get("state") != state:
        type_, reason, text = STATE_EVENTS[state]
        return [type_, reason, text.format(what=what), digest]
    return None


def _gone(digest: str, old: dict, wanted: set[str]) -> list[str]:
    what = _what(digest, old)
    if digest in wanted:
        return [WARNING, "Evicted", f"{what} removed by the node while still wanted (disk pressure)", digest]
    return [NORMAL, "Collected", f"{what} removed: it left spec.models", digest]


def transitions(before: dict | None, after: dict | None) -> list[list[str]]:
    """``[type, reason, message, series key]`` of each entry that changed from ``before`` to ``after``."""
    if before is None or after is None:  # a store first seen (or rebuilt mirror) or deleted: nothing happened
        return []
    old, new = mirror.entries_of(before), mirror.entries_of(after)
    wanted = {m.get("digest") for m in (after.get("spec") or {}).get("models") or [] if isinstance(m, dict)}
    found = []
    for digest in sorted(set(old) | set(new)):
        if digest not in new:
            found.append(_gone(digest, old[digest], wanted))
            continue
        event = _changed(digest, old.get(digest) or {}, new[digest])
        if event:
            found.append(event)
    return found


@reacts_to(mirror.STORES)
def record_entry_events(before: dict | None, after: dict | None, namespace: str, name: str) -> None:
    """Send the Events a mirrored change of a NodeModelStore means (at once: never held for a batch's end)."""
    found = transitions(before, after)
    if not found:
        return
    meta = after.get("metadata") or {}
    regarding = events.regarding("NodeModelStore", meta.get("name", ""), meta.get("uid", ""))
    send(RECORD_EVENTS, regarding, found)
