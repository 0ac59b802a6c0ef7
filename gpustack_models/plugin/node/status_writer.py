"""The node's NodeModelStore status, written from the engine on the thresholds the API promises.

Every change of state is written at once; progress fields (``downloadedBytes``, ``storedBytes``,
``usedPercent``) only when at least ``progress_interval`` seconds have passed since the last write *and*
some download moved at least 5 % of its size (at most 20 writes per download); a quiet node writes
nothing. The status is rebuilt from disk at start and whenever the store's UID changes (``force``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime

from gpustack_models import kube
from gpustack_models.kinds import GROUP, STORAGE_VERSION
from gpustack_models.kinds.formatting import capacity_text

log = logging.getLogger(__name__)

API = f"{GROUP}/{STORAGE_VERSION}"
FIELD_MANAGER = "gpustack-models-plugin"
PROGRESS_FIELDS = ("downloadedBytes",)
MAX_ENTRIES = 256


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusWriter:
    """Writes the store's status from the engine (see the module's docstring)."""

    def __init__(self, plugin):
        self.plugin = plugin
        self.written: dict | None = None  # the status last written
        self.written_at = 0.0
        self.kick = threading.Event()
        self.force = False
        self.writes = 0

    def snapshot(self) -> dict:
        engine = self.plugin.engine
        models = [e.status() for e in engine.entries()][:MAX_ENTRIES]
        capacity = engine.capacity()
        low = engine.capacity_low()
        previous = {c["type"]: c for c in ((self.written or {}).get("conditions") or [])}

        def cond(type_, status, reason, message):
            old = previous.get(type_)
            since = old["lastTransitionTime"] if old and old.get("status") == status else now_iso()
            return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}

        return {
            "observedGeneration": self.plugin.generation,
            "capacity": capacity,
            "models": models,
            "conditions": [
                cond("Ready", "True", "PluginRunning", "the node plugin is running"),
                cond(
                    "CapacityLow",
                    "True" if low else "False",
                    "AboveHighWatermark" if low else "BelowWatermarks",
                    capacity_text(capacity["totalBytes"], capacity["storedBytes"], capacity["usedPercent"]),
                ),
            ],
        }

    @staticmethod
    def _without_progress(status: dict) -> dict:
        out = json.loads(json.dumps(status))
        out["capacity"] = {k: v for k, v in out["capacity"].items() if k == "totalBytes"}
        for model in out["models"]:
            for key in PROGRESS_FIELDS:
                if model.get("state") == "Downloading":
                    model.pop(key, None)
        for c in out["conditions"]:
            c.pop("message", None)
            c.pop("lastTransitionTime", None)
        return out

    def _moved_enough(self, new: dict) -> bool:
        old = {m["digest"]: m for m in (self.written or {}).get("models") or []}
        for model in new["models"]:
            if model.get("state") != "Downloading":
                continue
            before = old.get(model["digest"], {}).get("downloadedBytes", 0)
            size = model.get("sizeBytes") or 0
            if size and (model.get("downloadedBytes", 0) - before) * 20 >= size:
                return True
        return False

    def due(self, new: dict) -> bool:
        if self.force or self.written is None:
            return True
        if self._without_progress(new) != self._without_progress(self.written):
            return True
        if new == self.written:
            return False
        return time.monotonic() - self.written_at >= self.plugin.settings.progress_interval and self._moved_enough(new)

    def tick(self) -> bool:
        new = self.snapshot()
        if not self.due(new):
            return False
        body = {
            "apiVersion": API,
            "kind": "NodeModelStore",
            "metadata": {"name": self.plugin.settings.node},
            "status": new,
        }
        try:
            self.plugin.kube.apply(
                f"/apis/{API}/nodemodelstores/{self.plugin.settings.node}/status", body, field_manager=FIELD_MANAGER
            )
        except kube.NotFound:  # no store (yet): the service creates it; write when it appears
            return False
        self.written, self.written_at, self.force = new, time.monotonic(), False
        self.writes += 1
        return True

    def run(self) -> None:
        while not self.plugin.stopping.is_set():
            self.kick.wait(1.0)
            self.kick.clear()
            try:
                self.tick()
            except Exception as exc:
                log.warning("writing the store's status failed: %s", exc)
                time.sleep(1)
