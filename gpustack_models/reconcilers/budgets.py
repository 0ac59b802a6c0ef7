"""Fair shares of the hubs: every namespace has its own budget of resolution attempts.

The hubs rate-limit the service as one client. Without shares, a tenant with hundreds of broken artifacts
(each retried with backoff) would spend that limit and everyone else's resolutions would fail with 429.
``take(namespace)`` spends one attempt of the namespace's token bucket, or says how long to wait for the
next one; the row is updated under its lock, so Celery workers in any number share one bucket.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpustack_models.models import ResolveBudget


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
