"""The message a person reads in the Pod's events while its model is not Ready on the node yet.

The kubelet shows NodePublishVolume's error in the Pod's events and tries again, so the message says
what the node is doing with the model: waiting, downloading (percent and bytes), or failed and retrying.
Sizes print as everywhere else (``3.1Gi``): ``kinds.formatting.human_bytes``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from gpustack_models.kinds.formatting import human_bytes
from gpustack_models.plugin.engine.jobs import DOWNLOADING, FAILED, Entry


def _retry(entry: Entry, now: float) -> str:
    if entry.retry_time is None:
        return "retrying"
    if entry.retry_time <= now:
        return "retrying now"
    at = datetime.fromtimestamp(entry.retry_time, tz=UTC).strftime("%H:%M:%S UTC")
    return f"retrying in {int(entry.retry_time - now) + 1} s (at {at})"


def not_ready_message(artifact: str, entry: Entry | None, now: float | None = None) -> str:
    """What the node is doing with ``artifact``'s digest (``entry``: its store entry, if any)."""
    now = time.time() if now is None else now
    model = f"model {artifact}"
    if entry is None or (entry.state == DOWNLOADING and not entry.size_bytes):
        return f"{model} is waiting to be downloaded on this node"
    if entry.state == FAILED:
        detail = f"{entry.reason}: {entry.message}" if entry.message else str(entry.reason)
        return f"{model} failed to download on this node ({detail}); {_retry(entry, now)}"
    if entry.state == DOWNLOADING:
        done, size = min(entry.downloaded_bytes, entry.size_bytes), entry.size_bytes
        percent = done * 100 // size
        return f"{model} is downloading on this node: {percent} % ({human_bytes(done)} of {human_bytes(size)})"
    return f"{model} is not ready on this node ({entry.state})"
