"""Fair shares: of the hubs (every namespace has its own budget of resolution attempts) and of the nodes
(what each namespace's prefetches may place on one node, and whether they may pin).

The hubs rate-limit the service as one client. Without shares, a tenant with hundreds of broken artifacts
(each retried with backoff) would spend that limit and everyone else's resolutions would fail with 429.
``take(namespace)`` spends one attempt of the namespace's token bucket, or says how long to wait for the
next one; the row is updated under its lock, so Celery workers in any number share one bucket.

A node's ``spec.models`` holds a bounded number of digests. Without shares, one tenant's many tiny pinned
prefetches would take every place on every node. ``namespace_limits`` gives each namespace's share: bytes
and digests per node (``GPUSTACK_PREFETCH_BYTES_PER_NODE``, ``GPUSTACK_PREFETCH_DIGESTS_PER_NODE``) and
whether its prefetches may pin (never by default). Administrators set a namespace's own on its Namespace,
which tenants cannot write: the annotations ``worker.gpustack.ai/prefetch-bytes-per-node`` (mirrored as a
column), ``worker.gpustack.ai/prefetch-digests-per-node`` (a non-negative integer, 0 for no limit; anything
else is ignored) and ``worker.gpustack.ai/pinning-allowed`` (``"true"``; anything else allows none).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpustack_models.informers.mirror import PREFETCH_BYTES_ANNOTATION
from gpustack_models.kinds import GROUP
from gpustack_models.models import Namespace, ResolveBudget

log = logging.getLogger(__name__)

PREFETCH_DIGESTS_ANNOTATION = f"{GROUP}/prefetch-digests-per-node"
PINNING_ALLOWED_ANNOTATION = f"{GROUP}/pinning-allowed"
SHARE_ANNOTATIONS = (PREFETCH_BYTES_ANNOTATION, PREFETCH_DIGESTS_ANNOTATION, PINNING_ALLOWED_ANNOTATION)


@dataclass(frozen=True)
class Share:
    """What one namespace's prefetches may place on one node: bytes and distinct digests (0: no limit), and
    whether a pinned prefetch is kept pinned (else it is treated as unpinned)."""

    bytes: int = 0
    digests: int = 0
    pinning: bool = False


def _annotations(body: dict | None) -> dict:
    return ((body or {}).get("metadata") or {}).get("annotations") or {}


def _digests(name: str, annotations: dict) -> int:
    raw = annotations.get(PREFETCH_DIGESTS_ANNOTATION)
    if raw is None:
        return settings.PREFETCH_DIGESTS_PER_NODE
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        log.warning("namespace %s: ignoring %s=%r: not a number of digests", name, PREFETCH_DIGESTS_ANNOTATION, raw)
        return settings.PREFETCH_DIGESTS_PER_NODE
    return value


def share_of(name: str, body: dict | None, bytes_per_node: int | None) -> Share:
    """The share of the namespace ``name`` from its mirrored ``body`` and byte limit column (None: the
    setting's). A namespace not mirrored yet gets the settings' share and no pinning."""
    annotations = _annotations(body)
    return Share(
        bytes=settings.PREFETCH_BYTES_PER_NODE if bytes_per_node is None else bytes_per_node,
        digests=_digests(name, annotations),
        pinning=annotations.get(PINNING_ALLOWED_ANNOTATION) == "true",
    )


def namespace_limits(namespaces: set[str]) -> dict[str, Share]:
    """The share of each of ``namespaces`` (see the module's docstring)."""
    rows = Namespace.objects.live().filter(name__in=namespaces).values_list("name", "body", "prefetch_bytes_per_node")
    found = {name: share_of(name, body, limit) for name, body, limit in rows}
    return {ns: found.get(ns) or share_of(ns, None, None) for ns in namespaces}


def pinning_allowed(namespace: str) -> bool:
    """Whether an administrator allowed the prefetches of ``namespace`` to pin."""
    return namespace_limits({namespace})[namespace].pinning


def take(namespace: str) -> float:
    """Spend one attempt: 0 if it may start now, else the seconds until the namespace has one."""
    rate = settings.RESOLVE_NAMESPACE_RATE / 60.0  # attempts per second
    burst = float(settings.RESOLVE_NAMESPACE_BURST)
    now = timezone.now()
    with transaction.atomic():
        budget, _ = ResolveBudget.objects.select_for_update().get_or_create(
            namespace=namespace, defaults={"tokens": burst, "refilled_at": now}
        )
        elapsed = max(0.0, (now - budget.refilled_at).total_seconds())
        budget.tokens = min(burst, budget.tokens + elapsed * rate)
        budget.refilled_at = now
        wait = 0.0
        if budget.tokens >= 1.0:
            budget.tokens -= 1.0
        else:
            wait = (1.0 - budget.tokens) / rate
        budget.save(update_fields=["tokens", "refilled_at"])
    return wait
