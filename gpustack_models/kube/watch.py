"""The one list-then-watch loop of the code base: informers, the front-proxy ConfigMap and the plugin's
own NodeModelStore all watch through it.

``list_and_watch`` is one finite, testable cycle, in the shape of kopf's continuous watch:

1. without a resourceVersion, list the collection in pages (``handler.page`` per page, then
   ``handler.listed`` with the list's resourceVersion);
2. watch from that resourceVersion with bookmarks, updating it from every event and passing
   ADDED/MODIFIED/DELETED to ``handler.event``;
3. return the resourceVersion to continue from when the server ends the watch, when nothing (not
   even a bookmark) arrived for ``SILENCE_SECONDS`` (a dead connection), or within ``STOP_POLL``
   seconds of ``stop`` being set (the connection is shut down, so a read blocked on a quiet watch
   returns at once instead of holding a stopping process for its silence timeout);
4. return ``""`` on 410 Expired (the caller lists again); raise the ``StatusError`` of any other error
   answer or ERROR event.

``watch_forever`` wraps it in the one backoff loop: list again at once after 410, reconnect from the
last resourceVersion after any other failure, waiting 0.5 s doubling to 30 s.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass

import urllib3

from gpustack_models.kube.client import Kube
from gpustack_models.kube.errors import Expired, error_for

log = logging.getLogger(__name__)

PAGE_SIZE = 500
WATCH_SECONDS = 300
# kube-apiserver sends a bookmark about once a minute; silence for longer means a dead connection.
SILENCE_SECONDS = 90
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0
STOP_POLL = 0.5  # seconds between looks at ``stop`` while a watch is open


@dataclass(frozen=True)
class WatchTarget:
    """What to watch: a collection's path and its selectors."""

    path: str
    label_selector: str = ""
    field_selector: str = ""

    def query(self, **extra: str) -> dict:
        query = dict(extra)
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        return query


class WatchHandler:
    """What a watcher does with what it sees; override what it needs."""

    def relisting(self) -> None:
        """A (re)list starts: what an earlier, unfinished one sent is void."""

    def page(self, items: list[dict]) -> None:
        """One page of a (re)list, in order."""

    def listed(self, resource_version: str, expired: bool) -> None:
        """A (re)list is complete at ``resource_version`` (``expired``: it followed a 410)."""

    def event(self, type_: str, obj: dict) -> None:
        """One ADDED, MODIFIED or DELETED event."""

    def watching(self, resource_version: str) -> None:
        """A watch from ``resource_version`` is being opened."""


def list_all(client: Kube, target: WatchTarget, handler: WatchHandler, expired: bool = False) -> str:
    """List ``target`` in pages into ``handler``; the list's resourceVersion."""
    handler.relisting()
    cont = ""
    while True:
        query = target.query(limit=str(PAGE_SIZE), **({"continue": cont} if cont else {}))
        page = client.get(target.path, query=query, timeout=120)
        handler.page(page.get("items") or [])
        metadata = page.get("metadata") or {}
        cont = metadata.get("continue") or ""
        if not cont:
            resource_version = metadata["resourceVersion"]
            handler.listed(resource_version, expired)
            return resource_version


def list_and_watch(
    client: Kube,
    target: WatchTarget,
    handler: WatchHandler,
    *,
    resource_version: str = "",
    expired: bool = False,
    stop: threading.Event | None = None,
) -> str:
    """One cycle (see the module's docstring): the resourceVersion to continue from, ``""`` to relist."""
    if not resource_version:
        resource_version = list_all(client, target, handler, expired)
    handler.watching(resource_version)
    query = target.query(
        watch="true",
        resourceVersion=resource_version,
        allowWatchBookmarks="true",
        timeoutSeconds=str(WATCH_SECONDS),
    )
    resp = client.request("GET", target.path, query=query, stream=True, read_timeout=SILENCE_SECONDS)
    ended = _shut_down_on_stop(resp, stop)
    try:
        if resp.status != 200:
            raise error_for(resp.status, resp.read())
        return _follow(resp, handler, resource_version, stop)
    except Expired:
        return ""
    finally:
        ended.set()
        resp.release_conn()


def _shut_down_on_stop(resp, stop: threading.Event | None) -> threading.Event:
    """Shut the watch's connection down once ``stop`` is set, until the returned event is set (the watch
    ended by itself)."""
    ended = threading.Event()
    if stop is None:
        return ended

    def guard() -> None:
        while not ended.is_set():
            if stop.wait(STOP_POLL):
                if not ended.is_set():
                    try:
                        resp.shutdown()
                    except (OSError, ValueError, RuntimeError):  # already closed or released
                        pass
                return

    threading.Thread(target=guard, name="watch-stop", daemon=True).start()
    return ended


def _follow(resp, handler: WatchHandler, resource_version: str, stop: threading.Event | None) -> str:
    try:
        for line in resp:
            if stop is not None and stop.is_set():
                break
            if line.strip():
                resource_version = _dispatch(json.loads(line), handler) or resource_version
    except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError, OSError) as exc:
        if stop is None or not stop.is_set():
            if not isinstance(exc, urllib3.exceptions.HTTPError):
                raise  # a socket error while not stopping: reconnect after the backoff, as before
            log.info("watch of %s ended: %s", resp.geturl() or "", exc)
    return resource_version


def _dispatch(event: dict, handler: WatchHandler) -> str:
    """Hand one event to ``handler``; the resourceVersion it carries."""
    type_, obj = event.get("type"), event.get("object") or {}
    if type_ == "ERROR":
        raise error_for(obj.get("code") or 500, obj)
    if type_ in ("ADDED", "MODIFIED", "DELETED"):
        handler.event(type_, obj)
    return (obj.get("metadata") or {}).get("resourceVersion") or ""


def watch_forever(
    client: Kube, target: WatchTarget, handler: WatchHandler, stop: threading.Event, name: str = ""
) -> None:
    """``list_and_watch`` again and again until ``stop`` is set (see the module's docstring)."""
    resource_version, expired, backoff = "", False, BACKOFF_FIRST
    name = name or target.path
    while not stop.is_set():
        try:
            was = resource_version
            resource_version = list_and_watch(
                client, target, handler, resource_version=resource_version, expired=expired, stop=stop
            )
            expired = not resource_version
            if expired:
                log.info("%s: resourceVersion %s expired; listing again", name, was)
            backoff = BACKOFF_FIRST
        except Exception as exc:  # reconnect from the last resourceVersion after a pause
            log.warning("%s: %s; reconnecting in %.1fs", name, exc, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)
