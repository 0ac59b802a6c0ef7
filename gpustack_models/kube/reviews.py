"""Asking kube-apiserver who a bearer token belongs to (TokenReview), with a small cache of answers.

Both the aggregated API and the node plugin authenticate callers this way; answers are reused for a
few seconds (``ttl``), keyed by the token's sha256 so no token is kept in memory longer than a request, and
at most ``maxsize`` of them are kept (the oldest go first).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable


class TTLCache:
    """Answers kept for ``ttl`` seconds each and at most ``maxsize`` of them: when full, the expired ones
    go, else the oldest, so no number of distinct callers or requests makes it grow. Thread-safe.
    ``clock``: the monotonic seconds the ``ttl`` counts in (for tests)."""

    def __init__(self, maxsize: int = 4096, clock: Callable[[], float] = time.monotonic):
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self._clock = clock
        self._data: OrderedDict = OrderedDict()  # key -> (value, expires), oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key):
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            if entry[1] < self._clock():
                del self._data[key]
                return None
            return entry[0]

    def set(self, key, value, ttl: float) -> None:
        if ttl <= 0:
            return
        now = self._clock()
        with self._lock:
            self._data.pop(key, None)
            if len(self._data) >= self.maxsize:
                self._make_room(now)
            self._data[key] = (value, now + ttl)

    def _make_room(self, now: float) -> None:
        """Drop every expired answer; when none had expired, the oldest tenth (so a flood of new keys
        sweeps once per tenth of ``maxsize``, not on every answer)."""
        for key in [k for k, (_, expires) in self._data.items() if expires < now]:
            del self._data[key]
        if len(self._data) >= self.maxsize:
            for _ in range(max(1, self.maxsize // 10)):
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


class TokenReviewer:
    """``review(token)``: the TokenReview ``status.user`` of an authenticated token, else ``None``."""

    def __init__(
        self,
        client: Callable,
        ttl: Callable[[], float] | float,
        maxsize: int = 4096,
        audiences: tuple[str, ...] = (),
        observe: Callable[[bool], None] | None = None,
    ):
        self._client = client  # a callable returning the Kube client (created lazily)
        self._observe = observe  # called with True for an answer from the cache, False for one asked
        self._ttl = ttl
        self.audiences = tuple(audiences)  # the token must be for one of these (none: kube-apiserver's own)
        self._cache = TTLCache(maxsize=maxsize)

    def review(self, token: str) -> dict | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._cache.get(key)
        if self._observe is not None:
            self._observe(hit is not None)
        if hit is not None:
            return hit[0]
        spec = {"token": token}
        if self.audiences:
            spec["audiences"] = list(self.audiences)
        answer = self._client().create(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec},
        )
        status = answer.get("status") or {}
        user = (status.get("user") or {}) if self._accepted(status) else None
        ttl = self._ttl() if callable(self._ttl) else self._ttl
        self._cache.set(key, (user,), ttl)
        return user

    def _accepted(self, status: dict) -> bool:
        if not status.get("authenticated"):
            return False
        return not self.audiences or bool(set(self.audiences) & set(status.get("audiences") or ()))

    def clear(self) -> None:
        self._cache.clear()
