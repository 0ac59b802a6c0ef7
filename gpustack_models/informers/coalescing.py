"""Batched informer events: the informer's events coalesced per object and sent as one Celery task.

``Coalescer`` is the buffer of one resource: per object (namespace/name), in the order objects were first
seen, the latest state wins; a DELETED replaces every earlier state of its object, and a state after a
DELETED (the object created again) follows it, so an object has at most two entries: ``[DELETED, state]``.
Each entry carries the arrival time (wall clock) of the first event it stands for and how many events it
stands for, so the mirror's lag is measured from the first of them.

``BatchingSink`` holds one ``Coalescer`` per resource and sends it as one ``mirror_events`` task when
the first event in it is ``seconds`` old or when it holds ``size`` entries. A relist page, a prune or
a record sends what is buffered first, so neither overtakes the other. ``close()`` sends what is left;
an event after it is sent at once on its own. What cannot be sent (the broker away) goes back into the
buffer, ahead of what came since, and is tried again a second later; a send the watch thread made
raises as before, so its watch reconnects.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


def object_key(obj: dict) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


@dataclass
class Buffered:
    """One buffered state: the event type, the object, when its first event arrived, how many events."""

    type: str
    obj: dict
    arrived: float
    events: int = 1

    def wire(self) -> list:
        return [self.type, self.obj, self.arrived, self.events]


class Coalescer:
    """The buffer of one resource (see the module's docstring)."""

    def __init__(self):
        self.objects: dict[tuple[str, str], list[Buffered]] = {}
        self.size = 0  # entries held

    def add(self, type_: str, obj: dict, arrived: float, events: int = 1) -> None:
        key = object_key(obj)
        held = self.objects.setdefault(key, [])
        self.size -= len(held)
        if type_ == "DELETED" and held:
            held[:] = [Buffered(type_, obj, held[0].arrived, sum(e.events for e in held) + events)]
        elif held and held[-1].type != "DELETED":
            last = held[-1]
            held[-1] = Buffered(type_, obj, last.arrived, last.events + events)
        else:
            held.append(Buffered(type_, obj, arrived, events))
        self.size += len(held)

    def take(self) -> list[list]:
        """The entries in order ([type, object, arrived, events] each), leaving the buffer empty."""
        entries = [e.wire() for held in self.objects.values() for e in held]
        self.objects, self.size = {}, 0
        return entries


class BatchingSink:
    """Buffers watch events per resource and hands them to ``inner.events`` in batches (see the module)."""

    def __init__(self, inner, seconds: float, size: int):
        self.inner, self.seconds, self.size = inner, seconds, max(1, size)
        self.buffers: dict[str, Coalescer] = {}
        self.lock = threading.Condition()  # guards the buffers, the deadline and ``closed``
        self.sending = threading.Lock()  # one send at a time, in the order the buffers were taken
        self.deadline: float | None = None  # monotonic time of the next timed flush
        self.closed = False
        self.timer = threading.Thread(target=self._timed_flushes, name="informer-batches", daemon=True)
        self.timer.start()

    def event(self, resource: str, kind: str, obj: dict) -> None:
        arrived = time.time()
        with self.lock:
            closed, full = self.closed, False
            if not closed:
                buffer = self.buffers.setdefault(resource, Coalescer())
                buffer.add(kind, obj, arrived)
                if self.deadline is None:
                    self.deadline = time.monotonic() + self.seconds
                    self.lock.notify_all()
                full = buffer.size >= self.size
        if closed:
            with self.sending:
                self.inner.events(resource, [[kind, obj, arrived, 1]])
        elif full:
            self.flush()

    def flush(self) -> None:
        """Send everything buffered now, one task per resource."""
        with self.sending:
            self._send_buffered()

    def _send_buffered(self) -> None:
        with self.lock:
            taken = [(resource, buffer.take()) for resource, buffer in self.buffers.items() if buffer.size]
            self.deadline = None
        for i, (resource, entries) in enumerate(taken):
            try:
                self.inner.events(resource, entries)
            except Exception:
                self._put_back(taken[i:])
                raise

    def _put_back(self, taken: list) -> None:
        """Entries that could not be sent go back ahead of what came since; tried again in a second."""
        with self.lock:
            for resource, entries in taken:
                buffer, since = Coalescer(), self.buffers.get(resource)
                for entry in entries + (since.take() if since else []):
                    buffer.add(*entry)
                self.buffers[resource] = buffer
            self.deadline = time.monotonic() + 1.0
            self.lock.notify_all()

    def batch(self, resource: str, objects: list[dict]) -> None:
        with self.sending:
            self._send_buffered()
            self.inner.batch(resource, objects)

    def prune(self, resource: str, keys: list[dict], list_rv: int) -> None:
        with self.sending:
            self._send_buffered()
            self.inner.prune(resource, keys, list_rv)

    def record(self, resource: str, resource_version: str, expired: bool) -> None:
        with self.sending:
            self._send_buffered()
            self.inner.record(resource, resource_version, expired)

    def close(self) -> None:
        """Send what is buffered and stop the timer; later events are sent one by one."""
        with self.lock:
            self.closed = True
            self.lock.notify_all()
        self.flush()
        self.timer.join(5)

    def _timed_flushes(self) -> None:
        while True:
            with self.lock:
                while not self.closed and self.deadline is None:
                    self.lock.wait()
                if self.closed:
                    return
                delay = self.deadline - time.monotonic()
                if delay > 0:
                    self.lock.wait(delay)
                    continue
            try:
                self.flush()
            except Exception as exc:  # the broker is away: kept, and tried again
                log.warning("informer events kept for a second try: %s", exc)
