"""List-then-watch loops feeding the mirror through Celery tasks.

``Informer.run_once`` is one finite cycle: list (in pages), send the objects and the prune of what
disappeared, then watch from the list's resourceVersion with bookmarks, tracking the resourceVersion of
every event. It returns when the watch ends: ``Expired`` (410) asks for a relist, anything else for a
reconnect from the last resourceVersion. ``Informer.run_forever`` loops around it with backoff. No
Secret informer: the worker reads a Secret by name when it needs one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field

import urllib3

from . import kube

log = logging.getLogger(__name__)

BATCH = 100
WATCH_SECONDS = 300
# kube-apiserver sends a bookmark about once a minute; silence for longer means a dead connection.
SILENCE_SECONDS = 90


class Expired(Exception):
    """The resourceVersion is too old (410): relist."""


@dataclass
class Informer:
    resource: str  # the mirror kind's resource name
    path: str  # collection path
    label_selector: str = ""
    client: kube.Kube | None = None
    sink: object = None  # dispatches to Celery; tests may replace it
    resource_version: str = ""
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        if self.sink is None:
            self.sink = CelerySink()

    @property
    def kube(self) -> kube.Kube:
        return self.client or kube.worker()

    # --- list ------------------------------------------------------------------------------------------
    def relist(self, expired: bool = False) -> None:
        keys: list[dict] = []
        cont = ""
        while True:
            query = {"limit": "500"}
            if self.label_selector:
                query["labelSelector"] = self.label_selector
            if cont:
                query["continue"] = cont
            page = self.kube.get(self.path, query=query, timeout=120)
            items = page.get("items") or []
            for start in range(0, len(items), BATCH):
                self.sink.batch(self.resource, [strip(i) for i in items[start : start + BATCH]])
            for item in items:
                meta = item.get("metadata") or {}
                key = {"name": meta.get("name", "")}
                if meta.get("namespace"):
                    key["namespace"] = meta["namespace"]
                keys.append(key)
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                self.resource_version = page["metadata"]["resourceVersion"]
                break
        self.sink.prune(self.resource, keys, int(self.resource_version))
        self.sink.record(self.resource, self.resource_version, relisted=True, expired=expired)
        log.info("%s: listed %d objects at resourceVersion %s", self.resource, len(keys), self.resource_version)

    # --- watch -----------------------------------------------------------------------------------------
    def watch(self) -> None:
        query = {
            "watch": "true",
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        resp = self.kube.pool.request(
            "GET",
            self.kube.url(self.path, query),
            headers={"Accept": "application/json", **self.kube.auth_headers()},
            timeout=urllib3.Timeout(connect=10, read=SILENCE_SECONDS),
            preload_content=False,
        )
        try:
            if resp.status == 410:
                raise Expired()
            if resp.status != 200:
                raise kube.KubeError(resp.status, resp.read())
            for line in resp:
                if self.stop.is_set():
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Expired()
                    raise kube.KubeError(obj.get("code") or 500, obj)
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.sink.event(self.resource, kind, strip(obj))
                if rv:
                    self.resource_version = rv
        finally:
            resp.release_conn()

    def run_once(self) -> None:
        """One cycle: a relist when there is no resourceVersion, then one watch."""
        if not self.resource_version:
            self.relist()
        try:
            self.watch()
        except Expired:
            log.info("%s: resourceVersion %s expired; relisting", self.resource, self.resource_version)
            self.resource_version = ""
            self.relist(expired=True)

    def run_forever(self) -> None:
        backoff = 0.5
        while not self.stop.is_set():
            try:
                self.run_once()
                backoff = 0.5
                self.sink.record(self.resource, self.resource_version, relisted=False, expired=False)
            except Exception as exc:  # reconnect from the last resourceVersion after a pause
                log.warning("%s: %s; reconnecting in %.1fs", self.resource, exc, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)


def strip(obj: dict) -> dict:
    """The object without managedFields (the mirror never needs them; they are most of an object)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj


class CelerySink:
    """Each event becomes a Celery task."""

    def event(self, resource: str, kind: str, obj: dict) -> None:
        from .tasks import mirror_event

        mirror_event.delay(resource, kind, obj)

    def batch(self, resource: str, objects: list[dict]) -> None:
        from .tasks import mirror_batch

        mirror_batch.delay(resource, objects)

    def prune(self, resource: str, keys: list[dict], list_rv: int) -> None:
        from .tasks import mirror_prune

        mirror_prune.delay(resource, keys, list_rv)

    def record(self, resource: str, resource_version: str, relisted: bool, expired: bool) -> None:
        from .tasks import record_informer

        if relisted or expired:
            record_informer.delay(resource, resource_version, relisted, expired)


def informers(namespace: str, plugin_selector: str) -> list[Informer]:
    from .resources.kinds import GROUP, STORAGE_VERSION

    base = f"/apis/{GROUP}/{STORAGE_VERSION}"
    return [
        Informer("modelartifacts", f"{base}/modelartifacts"),
        Informer("nodemodelstores", f"{base}/nodemodelstores"),
        Informer("modelprefetches", f"{base}/modelprefetches"),
        Informer("nodes", "/api/v1/nodes"),
        Informer("pods", f"/api/v1/namespaces/{namespace}/pods", label_selector=plugin_selector),
    ]


def run_all(items: list[Informer]) -> None:
    threads = [threading.Thread(target=i.run_forever, name=f"informer-{i.resource}", daemon=True) for i in items]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            time.sleep(1)
    finally:
        for i in items:
            i.stop.set()
