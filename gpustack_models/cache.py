"""A small thread-safe cache whose entries expire, for TokenReview and SubjectAccessReview answers."""

from __future__ import annotations

import threading
import time


class TTLCache:
    def __init__(self, maxsize: int = 4096):
        self.maxsize = maxsize
        self._data: dict = {}
        self._lock = threading.Lock()

    def get(self, key):
        entry = self._data.get(key)
        if entry is None:
            return None
        value, expires = entry
        if expires < time.monotonic():
            with self._lock:
                self._data.pop(key, None)
            return None
        return value

    def set(self, key, value, ttl: float) -> None:
        if ttl <= 0:
            return
        with self._lock:
            if len(self._data) >= self.maxsize:
                now = time.monotonic()
                self._data = {k: v for k, v in self._data.items() if v[1] >= now}
                if len(self._data) >= self.maxsize:
                    self._data.clear()
            self._data[key] = (value, time.monotonic() + ttl)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
