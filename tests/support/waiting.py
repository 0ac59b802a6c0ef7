"""Waiting for the real thing to happen: poll a condition until it holds or time runs out."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2, message: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; return that value or fail with ``message``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message} (last: {last!r})")
