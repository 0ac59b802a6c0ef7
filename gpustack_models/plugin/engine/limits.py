"""Node-wide limits shared by every download of the node, changeable while downloads run.

- ``ConnectionSlots``: at most ``limit`` HTTP requests for file bytes in flight at once, across all
  downloads (a slot is held from sending a request until its body is read or abandoned). Lowering
  the limit lets running requests finish; new ones wait until the count is under the new limit.
- ``RateLimiter``: at most ``bytes_per_second`` bytes read from the network per second, across all
  downloads; ``0`` means unlimited. A reader asks for the bytes it is about to read and sleeps until
  they fit in the budget; the budget allows a burst of at most ``burst_seconds`` worth of bytes, so
  an idle node does not build up credit.
- ``Limits``: the node's connection slots and rate limiter together, as its downloads share them
  (``clock`` and ``sleep``: the rate limiter's monotonic seconds and its wait, for tests).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ConnectionSlots:
    def __init__(self, limit: int):
        self._cond = threading.Condition()
        self._limit = _positive(limit, "concurrency")
        self._in_use = 0
        self.peak = 0  # highest number of slots held at once, for tests and metrics

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_use(self) -> int:
        return self._in_use

    def set_limit(self, limit: int) -> None:
        with self._cond:
            self._limit = _positive(limit, "concurrency")
            self._cond.notify_all()

    def acquire(self, cancelled: Callable[[], bool] | None = None, poll: float = 0.25) -> bool:
        """Take a slot; returns False (without a slot) if ``cancelled()`` turns true while waiting."""
        with self._cond:
            while self._in_use >= self._limit:
                if cancelled is not None and cancelled():
                    return False
                self._cond.wait(poll)
            self._in_use += 1
            if self._in_use > self.peak:
                self.peak = self._in_use
            return True

    def release(self) -> None:
        with self._cond:
            self._in_use -= 1
            self._cond.notify()


class RateLimiter:
    def __init__(
        self, bytes_per_second: int = 0, *, burst_seconds: float = 0.05, clock=time.monotonic, sleep=time.sleep
    ):
        self._lock = threading.Lock()
        self._rate = _non_negative(bytes_per_second, "bytes_per_second")
        self._burst = burst_seconds
        self._clock = clock
        self._sleep = sleep
        self._next = 0.0  # the time at which the budget is back to zero debt

    @property
    def bytes_per_second(self) -> int:
        return self._rate

    def set_rate(self, bytes_per_second: int) -> None:
        with self._lock:
            self._rate = _non_negative(bytes_per_second, "bytes_per_second")
            self._next = min(self._next, self._clock())

    def chunk(self, wanted: int, minimum: int = 16 * 1024) -> int:
        """How many bytes a reader should ask for at once: about 1/20 s worth under a limit, so the
        rate is smooth and a limit change takes effect quickly."""
        rate = self._rate
        if rate <= 0:
            return wanted
        return max(1, min(wanted, max(minimum, rate // 20)))

    def acquire(self, nbytes: int, cancelled: Callable[[], bool] | None = None) -> bool:
        """Wait until ``nbytes`` fit in the budget; False if ``cancelled()`` turned true meanwhile."""
        with self._lock:
            rate = self._rate
            if rate <= 0 or nbytes <= 0:
                return True
            now = self._clock()
            start = max(self._next, now - self._burst)
            self._next = start + nbytes / rate
            wait = start - now
        while wait > 0:
            if cancelled is not None and cancelled():
                return False
            step = min(wait, 0.25)
            self._sleep(step)
            wait -= step
        return True


class Limits:
    """The node-wide connection slots and rate limiter, shared by every download of the node."""

    def __init__(self, concurrency: int = 8, bytes_per_second: int = 0, *, clock=time.monotonic, sleep=time.sleep):
        self.slots = ConnectionSlots(concurrency)
        self.rate = RateLimiter(bytes_per_second, clock=clock, sleep=sleep)

    def set(self, concurrency: int | None = None, bytes_per_second: int | None = None) -> None:
        if concurrency is not None:
            self.slots.set_limit(concurrency)
        if bytes_per_second is not None:
            self.rate.set_rate(bytes_per_second)


def _positive(value: int, name: str) -> int:
    value = int(value)
    if value < 1:
        raise ValueError(f"{name} must be at least 1")
    return value


def _non_negative(value: int, name: str) -> int:
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value
