"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection`` does it.

Several replicas of a role (the informers, Celery beat) run; the one holding the role's Lease acts, the
others stand by. The Lease's spec carries ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``,
``renewTime`` and ``leaseTransitions``; every write is an update at the resourceVersion that was read, so
a 409 Conflict means someone else wrote it first (read again at the next try).

A candidate takes the Lease when it is absent, has no holder (a leader that stopped cleanly released
it), is already its own, or has expired. Expiry is judged as client-go judges it, never by the remote
clocks in ``renewTime``: the record has to stay unchanged, as this process observed it, for the
Lease's duration (``GPUSTACK_LEADER_LEASE_SECONDS`` when the record names none or a nonsensical one).
The leader renews every retry period; when it could not renew for the renew deadline since its last
successful renewal (at least one try made after any pause of the process), it has lost the Lease and
stops acting. On a clean stop it releases the Lease (no holder, a duration of one second), so a
standby takes over at its next try instead of after the Lease's duration.

``verdict`` is the decision alone (pure, unit-tested); ``LeaseElector`` the reads and writes around it.

Metrics (served on the metrics port of the role that elects): ``gpustack_models_leader_election_tries_total
{lease, outcome}``, every try by its outcome (``acquired``, ``renewed``, ``held`` by another, ``conflict``,
``error``), and ``gpustack_models_leader_election_leading{lease}``, 1 while this process holds the Lease.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from prometheus_client import Counter, Gauge

from gpustack_models.kube.client import Kube, default
from gpustack_models.kube.errors import Conflict, NotFound

log = logging.getLogger(__name__)

FREE, OURS, EXPIRED, HELD = "free", "ours", "expired", "held"
JITTER = 0.2  # a standby waits the retry period times 1 to 1.2, so standbys do not try in step
ACQUIRED, RENEWED = "acquired", "renewed"  # outcomes of a try, beside HELD, "conflict" and "error"

TRIES = Counter(
    "gpustack_models_leader_election_tries_total", "Tries to take or renew a Lease, by outcome.", ["lease", "outcome"]
)
LEADING = Gauge("gpustack_models_leader_election_leading", "1 while this process holds the Lease.", ["lease"])


def verdict(spec, identity: str, observed_at: float, now: float, default_duration: float) -> str:
    """What the Lease with ``spec`` (as read; possibly garbage) is to ``identity``: ``FREE`` (no holder),
    ``OURS``, ``EXPIRED`` (unchanged since ``observed_at`` for its duration, by this process's clock
    ``now``) or ``HELD`` by another, still valid."""
    holder = spec.get("holderIdentity") if isinstance(spec, dict) else None
    if not holder or not isinstance(holder, str):
        return FREE
    if holder == identity:
        return OURS
    if observed_at + lease_duration(spec, default_duration) < now:
        return EXPIRED
    return HELD


def lease_duration(spec: dict, default: float) -> float:
    """The record's ``leaseDurationSeconds``, or ``default`` when it is missing or not a positive integer."""
    value = spec.get("leaseDurationSeconds")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return default
    return float(value)


def micro_time(moment: datetime | None = None) -> str:
    """A Kubernetes ``MicroTime``."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_identity() -> str:
    """The host's name (the Pod's name in a cluster), the process id and a random suffix."""
    return f"{socket.gethostname()}_{os.getpid()}_{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Timing:
    """The Lease's duration, the renew deadline and the retry period, in seconds."""

    lease: float
    renew_deadline: float
    retry: float

    @classmethod
    def from_settings(cls) -> Timing:
        return cls(settings.LEADER_LEASE_SECONDS, settings.LEADER_RENEW_DEADLINE_SECONDS, settings.LEADER_RETRY_SECONDS)


class LeaseElector:
    """Acquires, renews and releases one Lease for this process (see the module's docstring)."""

    def __init__(self, client: Kube, namespace: str, name: str, timing: Timing, identity: str | None = None):
        self.client = client
        self.name = name
        self.timing = timing
        self.identity = identity or new_identity()
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self._leading = False
        LEADING.labels(name).set(0)
        self._observed_spec = None
        self._observed_at = 0.0
        self._last_renewal = 0.0
        self._announced_holder = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def leading(self) -> bool:
        return self._leading

    @leading.setter
    def leading(self, value: bool) -> None:
        self._leading = value
        LEADING.labels(self.name).set(1 if value else 0)

    # --- one try ------------------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """One read and, when the Lease may be ours, one write; whether this process now holds it."""
        with self._lock:
            if self._closed:
                return False
            try:
                outcome = self._try()
            except Conflict:
                log.debug("lease %s: written by someone else meanwhile; reading it again", self.name)
                outcome = "conflict"
            except Exception as exc:  # an error answer, the connection's own errors: try again next period
                log.warning("lease %s: %s: %s", self.name, type(exc).__name__, exc)
                outcome = "error"
            TRIES.labels(self.name, outcome).inc()
            return outcome in (ACQUIRED, RENEWED)

    def _try(self) -> str:
        """One try's outcome: ``ACQUIRED``, ``RENEWED`` or ``HELD``."""
        try:
            current = self.client.get(self.path, timeout=self.timing.renew_deadline)
        except NotFound:
            return self._create()
        spec = self._observe(current)
        state = verdict(spec, self.identity, self._observed_at, time.monotonic(), self.timing.lease)
        if state == HELD:
            self._announce_holder(spec.get("holderIdentity"))
            return HELD
        current["spec"] = self._next_spec(spec if isinstance(spec, dict) else {}, state == OURS)
        written = self.client.json("PUT", self.path, body=current, timeout=self.timing.renew_deadline)
        self._observe(written)
        self._last_renewal = time.monotonic()
        return RENEWED if state == OURS else ACQUIRED

    def _create(self) -> str:
        namespace = self.path.split("/")[5]
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": namespace},
            "spec": dict(self._next_spec({}, False), leaseTransitions=0),
        }
        created = self.client.create(self.path.rsplit("/", 1)[0], body, timeout=self.timing.renew_deadline)
        self._observe(created)
        self._last_renewal = time.monotonic()
        return ACQUIRED

    def _observe(self, lease: dict) -> dict | None:
        """Remember the record read and since when (this process's clock) it has stayed the same."""
        spec = lease.get("spec") if isinstance(lease, dict) else None
        if spec != self._observed_spec:
            self._observed_spec = spec
            self._observed_at = time.monotonic()
        return spec

    def _next_spec(self, spec: dict, ours: bool) -> dict:
        now = micro_time()
        transitions = spec.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) and transitions >= 0 else 0
        acquired = spec.get("acquireTime") if ours and spec.get("acquireTime") else now
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timing.lease)),
            "acquireTime": acquired,
            "renewTime": now,
            "leaseTransitions": transitions if ours else transitions + 1,
        }

    def _announce_holder(self, holder) -> None:
        if holder != self._announced_holder:
            self._announced_holder = holder
            log.info("standing by: lease %s held by %s", self.name, holder)

    # --- the loops ------------------------------------------------------------------------------------
    def acquire(self, stop: threading.Event) -> bool:
        """Try every retry period until this process holds the Lease (True) or ``stop`` is set (False)."""
        started = time.monotonic()
        while not stop.is_set():
            if self.try_acquire_or_renew():
                self.leading = True
                log.info(
                    "became leader of lease %s as %s after %.1f s", self.name, self.identity, time.monotonic() - started
                )
                return True
            stop.wait(self.timing.retry * (1 + JITTER * random.random()))
        return False

    def keep(self, stop: threading.Event) -> bool:
        """Renew every retry period until ``stop`` is set (False) or the Lease is lost (True): not renewed
        for the renew deadline since the last renewal, or taken by someone else."""
        while not stop.wait(self.timing.retry):
            if self.try_acquire_or_renew():
                continue
            holder = self._observed_spec.get("holderIdentity") if isinstance(self._observed_spec, dict) else None
            taken = bool(holder) and holder != self.identity
            if stop.is_set():
                return False
            if taken or time.monotonic() - self._last_renewal >= self.timing.renew_deadline:
                self.leading = False
                log.error("lost lease %s%s", self.name, f": taken by {holder}" if taken else "")
                return True
        return False

    def release(self) -> None:
        """Give the Lease up at once (a clean stop); this elector tries nothing after."""
        with self._lock:
            self._closed = True
            if not self.leading:
                return
            self.leading = False
            try:
                self._release()
            except Exception as exc:  # a standby then takes over after the Lease's duration
                log.warning("lease %s: could not release it: %s", self.name, exc)

    def _release(self) -> None:
        current = self.client.get(self.path, timeout=self.timing.renew_deadline)
        spec = current.get("spec") if isinstance(current.get("spec"), dict) else {}
        if spec.get("holderIdentity") != self.identity:
            return
        now = micro_time()
        current["spec"] = dict(spec, holderIdentity="", leaseDurationSeconds=1, acquireTime=now, renewTime=now)
        self.client.json("PUT", self.path, body=current, timeout=self.timing.renew_deadline)
        log.info("released lease %s", self.name)


def elector_for(name: str, client: Kube | None = None) -> LeaseElector:
    """An elector of the Lease ``name`` in the service's namespace, with the process's own identity and the
    timing of the settings."""
    return LeaseElector(client or default(), settings.NAMESPACE, name, Timing.from_settings())
