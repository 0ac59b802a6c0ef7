"""Informers: list-then-watch of the storage CRDs, Nodes and the plugin's Pods, feeding the mirror.

Each informer runs ``kube.watch.watch_forever`` (the one watch loop) with a handler that turns what it
sees into Celery tasks: the pages of a (re)list in batches, then the prune of what the list no longer
returned, then the watch events, coalesced per object and sent in batches (``coalescing.BatchingSink``:
``GPUSTACK_INFORMER_BATCH_SECONDS`` and ``GPUSTACK_INFORMER_BATCH_SIZE``; a size of 1 sends one task per
event). Every event carries its arrival time, so the mirror's lag is measured from it. No Secret
informer: the service reads a Secret by name when it needs one.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings

from gpustack_models import kube
from gpustack_models.informers.coalescing import BatchingSink
from gpustack_models.informers.mirror import trimmed
from gpustack_models.informers.sending import (
    MIRROR_BATCH,
    MIRROR_EVENT,
    MIRROR_EVENTS,
    MIRROR_PRUNE,
    RECORD_INFORMER,
    send,
)
from gpustack_models.kinds import GROUP, STORAGE_VERSION
from gpustack_models.kube.watch import WatchHandler, WatchTarget, watch_forever
from gpustack_models.telemetry import roles

log = logging.getLogger(__name__)

BATCH = 100


class CelerySink:
    """Each call becomes a Celery task, sent by name (``sending``: the reconcilers' task module is not imported)."""

    def event(self, resource: str, kind: str, obj: dict) -> None:
        send(MIRROR_EVENT, resource, kind, obj, arrived=time.time())
        roles.INFORMER_BATCHES.labels(resource).inc()

    def events(self, resource: str, entries: list[list]) -> None:
        send(MIRROR_EVENTS, resource, entries)
        roles.INFORMER_BATCHES.labels(resource).inc()

    def batch(self, resource: str, objects: list[dict]) -> None:
        send(MIRROR_BATCH, resource, objects)

    def prune(self, resource: str, keys: list[dict], list_rv: int) -> None:
        send(MIRROR_PRUNE, resource, keys, list_rv)

    def record(self, resource: str, resource_version: str, expired: bool) -> None:
        send(RECORD_INFORMER, resource, resource_version, True, expired)


@dataclass
class Informer(WatchHandler):
    """One mirrored resource: what to watch and where its events go."""

    resource: str  # the mirror kind's resource name
    target: WatchTarget
    client: kube.Kube | None = None
    sink: object = None  # dispatches to Celery; tests may replace it
    stop: threading.Event = field(default_factory=threading.Event)
    listed_keys: list[dict] = field(default_factory=list)
    lists: int = 0  # lists completed, watches opened (the metrics count those after the first)
    watches: int = 0

    def __post_init__(self):
        if self.sink is None:
            self.sink = default_sink()
        # Its relists and watch restarts are series from the start (at 0), so a rate over them reads 0, not nothing.
        roles.INFORMER_RELISTS.labels(self.resource)
        roles.INFORMER_WATCH_RESTARTS.labels(self.resource)

    @property
    def kube(self) -> kube.Kube:
        return self.client or kube.default()

    # --- WatchHandler ----------------------------------------------------------------------------------
    def relisting(self) -> None:
        self.listed_keys = []

    def page(self, items: list[dict]) -> None:
        for start in range(0, len(items), BATCH):
            self.sink.batch(self.resource, [trimmed(i) for i in items[start : start + BATCH]])
        self.listed_keys.extend(key_of(item) for item in items)

    def listed(self, resource_version: str, expired: bool) -> None:
        keys, self.listed_keys = self.listed_keys, []
        self.lists += 1
        if self.lists > 1:
            roles.INFORMER_RELISTS.labels(self.resource).inc()
        self.sink.prune(self.resource, keys, int(resource_version))
        self.sink.record(self.resource, resource_version, expired)
        log.info("%s: listed %d objects at resourceVersion %s", self.resource, len(keys), resource_version)

    def event(self, type_: str, obj: dict) -> None:
        roles.INFORMER_EVENTS.labels(self.resource, type_).inc()
        self.sink.event(self.resource, type_, trimmed(obj))

    def watching(self, resource_version: str) -> None:
        self.watches += 1
        if self.watches > 1:
            roles.INFORMER_WATCH_RESTARTS.labels(self.resource).inc()

    def run_forever(self) -> None:
        watch_forever(self.kube, self.target, self, self.stop, name=self.resource)

    def close(self) -> None:
        """Send what the sink still buffers (after the watch stopped)."""
        close = getattr(self.sink, "close", None)
        if close is not None:
            close()


def default_sink():
    """Batches of events (``GPUSTACK_INFORMER_BATCH_*``), or one task per event with a batch size of 1."""
    if settings.INFORMER_BATCH_SIZE <= 1:
        return CelerySink()
    return BatchingSink(CelerySink(), settings.INFORMER_BATCH_SECONDS, settings.INFORMER_BATCH_SIZE)


def key_of(obj: dict) -> dict:
    meta = obj.get("metadata") or {}
    key = {"name": meta.get("name", "")}
    if meta.get("namespace"):
        key["namespace"] = meta["namespace"]
    return key


def informers(namespace: str, plugin_selector: str) -> list[Informer]:
    base = f"/apis/{GROUP}/{STORAGE_VERSION}"
    return [
        Informer("modelartifacts", WatchTarget(f"{base}/modelartifacts")),
        Informer("nodemodelstores", WatchTarget(f"{base}/nodemodelstores")),
        Informer("modelprefetches", WatchTarget(f"{base}/modelprefetches")),
        Informer("nodes", WatchTarget("/api/v1/nodes")),
        Informer("namespaces", WatchTarget("/api/v1/namespaces")),
        Informer("pods", WatchTarget(f"/api/v1/namespaces/{namespace}/pods", label_selector=plugin_selector)),
    ]


def run_all(items: list[Informer], join_seconds: float = 2.0) -> None:
    """Run the informers until every one is told to stop (or none runs); then, once their watches
    stopped (or after ``join_seconds``: a watch may be waiting on a quiet connection; an event it hands
    over later is sent on its own), send what their sinks still buffer."""
    threads = [threading.Thread(target=i.run_forever, name=f"informer-{i.resource}", daemon=True) for i in items]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads) and not all(i.stop.is_set() for i in items):
            time.sleep(0.2)
    finally:
        for i in items:
            i.stop.set()
        deadline = time.monotonic() + join_seconds
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for i in items:
            try:
                i.close()
            except Exception:
                log.exception("%s: could not send the events still buffered", i.resource)
