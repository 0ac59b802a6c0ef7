"""Why a download on a node failed, and when it may be tried again.

The reasons are the ones a NodeModelStore reports for a model on its node (named, like what a hub's
statuses mean, in ``sources.hub_errors``):

- ``InvalidRequest``: the fetch ticket is unusable (bad digest, manifest not matching its digest,
  unknown source, bad endpoint), or the hub said so (400, 422);
- ``AccessDenied``: the hub refused the files (401, 403, 404, 410);
- ``SourceUnavailable``: the hub did not answer usefully (5xx, 429, network errors, stalls past the
  retries);
- ``IntegrityMismatch``: a file's size or hash, or the manifest digest recomputed from the
  verified files, differs from what the ticket promised;
- ``InsufficientCapacity``: the volume cannot take the remaining bytes under the high watermark;
- ``Canceled``: the caller cancelled the download.

Every failure but ``Canceled`` backs off: the first failure may be retried after 1 minute, each
further consecutive failure doubles the wait, up to 1 hour; a success resets the count.

A ticket may offer several sources of the same files. A hub's refusal or unavailability
(``FALLTHROUGH_REASONS``) fails one source only: the download goes on from the next one, and only
fails (and backs off) when every source failed. A source that failed is tried after the others for a
few minutes (``SourcePenalties``), by every download of the node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

from gpustack_models.sources.hub_errors import (
    ACCESS_DENIED,
    CANCELED,
    INSUFFICIENT_CAPACITY,
    INTEGRITY_MISMATCH,
    INVALID_REQUEST,
    SOURCE_UNAVAILABLE,
    Failure,
)

REASONS = (INVALID_REQUEST, ACCESS_DENIED, SOURCE_UNAVAILABLE, INTEGRITY_MISMATCH, INSUFFICIENT_CAPACITY, CANCELED)

# What one source's hub answered or failed to answer; another source of the same files may do better.
FALLTHROUGH_REASONS = (ACCESS_DENIED, SOURCE_UNAVAILABLE, INVALID_REQUEST)

BACKOFF_INITIAL_SECONDS = 60.0
BACKOFF_MAX_SECONDS = 3600.0
SOURCE_PENALTY_SECONDS = 300.0

S = TypeVar("S")


class DownloadFailed(Failure):
    """A download stopped for ``reason``, one of the node's ``REASONS`` (any other is a ``ValueError``).

    ``retry_after`` carries the hub's own ``Retry-After`` hint (seconds) when it gave one; the
    backoff never retries earlier than that hint.
    """

    def __init__(self, reason: str, message: str, *, retry_after: float | None = None):
        if reason not in REASONS:
            raise ValueError(f"unknown failure reason {reason!r}")
        super().__init__(reason, message, retry_after=retry_after)


def backoff_seconds(failures: int, retry_after: float | None = None, initial: float = BACKOFF_INITIAL_SECONDS) -> float:
    """The wait after the ``failures``-th consecutive failure (1 min, 2, 4, ... capped at 1 h),
    never shorter than the hub's ``retry_after`` hint (itself capped at 1 h)."""
    if failures <= 0:
        return 0.0
    delay = min(BACKOFF_MAX_SECONDS, initial * (2 ** min(failures - 1, 16)))
    if retry_after is not None and retry_after > delay:
        delay = min(BACKOFF_MAX_SECONDS, float(retry_after))
    return delay


class SourcePenalties:
    """The sources that failed lately, by ``key``: each is tried after the others for ``seconds`` after
    its last failure (and forgotten once it serves again). Thread-safe; shared by a node's downloads."""

    def __init__(self, seconds: float = SOURCE_PENALTY_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.seconds = float(seconds)
        self._clock = clock
        self._until: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def order(self, sources: Iterable[S], key: Callable[[S], Hashable]) -> list[S]:
        """``sources`` in their order, those failed lately last (the longest ago first among them)."""
        sources = list(sources)
        now = self._clock()
        with self._lock:
            for k in [k for k, until in self._until.items() if until <= now]:
                del self._until[k]
            until = dict(self._until)
        fresh = [s for s in sources if key(s) not in until]
        failed = sorted((s for s in sources if key(s) in until), key=lambda s: until[key(s)])
        return fresh + failed

    def failed(self, key: Hashable) -> None:
        with self._lock:
            self._until[key] = self._clock() + self.seconds

    def served(self, key: Hashable) -> None:
        with self._lock:
            self._until.pop(key, None)

    def penalized(self, key: Hashable) -> bool:
        with self._lock:
            until = self._until.get(key)
        return until is not None and until > self._clock()
