"""When a resolution is tried again, beyond the backoff of failures that pass on their own.

A failure only a person can fix (``AccessDenied``, ``RevisionNotFound``, ``EmptyManifest``,
``DigestMismatch``, ``InvalidManifest``) is not final:

- it is tried again slowly, per artifact, after ``GPUSTACK_RESOLVE_TERMINAL_RETRY_BASE`` doubling per
  failure up to ``GPUSTACK_RESOLVE_TERMINAL_RETRY_MAX`` (a token may be granted access, a tag created);
- it is tried at once when the Secret its ``secretRef`` names changes: the service may only ``get``
  Secrets, so a periodic pass reads each such Secret and compares its uid and resourceVersion with those
  the failed attempt read (a Secret created after being missing counts as a change);
- any artifact, resolved or not, is resolved again at once when its ``worker.gpustack.ai/requested-at``
  annotation takes a new value (as ``reconcile.fluxcd.io/requestedAt`` asks Flux), once per value.

The state is a ``ResolveState`` row per artifact, changed under its lock by any Celery worker process.
"""

from __future__ import annotations

import logging
from datetime import UTC, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from gpustack_models import kube
from gpustack_models.models import Artifact, ConditionStatus, ResolveState

log = logging.getLogger(__name__)

REQUESTED_AT = "worker.gpustack.ai/requested-at"
# Failures that pass on their own: the resolver's own backoff retries them (see ``resolution``).
RETRYABLE = ("SourceUnavailable", "SecretNotFound", "SecretKeyNotFound", "ClaimNotFound")


def _locked(namespace: str, name: str, uid: str) -> ResolveState:
    """The artifact's row, locked; a row left by an earlier object of the same name starts afresh."""
    state, _ = ResolveState.objects.select_for_update().get_or_create(
        namespace=namespace, name=name, defaults={"uid": uid}
    )
    if state.uid != uid:
        fresh = ResolveState(pk=state.pk, namespace=namespace, name=name, uid=uid)
        fresh.save()
        return fresh
    return state


def backoff(failures: int) -> float:
    """Seconds before the next try after ``failures`` failures in a row."""
    base, most = settings.RESOLVE_TERMINAL_RETRY_BASE, settings.RESOLVE_TERMINAL_RETRY_MAX
    return min(most, base * (2 ** min(max(failures - 1, 0), 32)))


def temporary_countdown(attempt: int, retry_after: float | None) -> float:
    """Seconds before attempt ``attempt + 1`` after a temporary failure: doubling from
    ``GPUSTACK_RESOLVE_RETRY_BASE`` up to ``GPUSTACK_RESOLVE_RETRY_MAX``, never sooner than the hub's
    ``Retry-After`` (itself capped at the maximum)."""
    countdown = min(settings.RESOLVE_RETRY_MAX, settings.RESOLVE_RETRY_BASE * (2**attempt))
    if retry_after:
        countdown = max(countdown, min(retry_after, settings.RESOLVE_RETRY_MAX))
    return countdown


def when_said(at) -> str:
    """A moment as conditions give times: RFC 3339 in UTC, to the second."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def failed(namespace: str, name: str, uid: str, reason: str, secret_name: str, secret_version: str) -> ResolveState:
    """A failure only a person can fix: schedule the next try, remember the Secret as this try read it."""
    now = timezone.now()
    with transaction.atomic():
        state = _locked(namespace, name, uid)
        state.failures = state.failures + 1 if state.failed_reason == reason else 1
        state.failed_reason = reason
        state.retry_at = now + timedelta(seconds=backoff(state.failures))
        state.secret_name, state.secret_version, state.secret_checked_at = secret_name, secret_version, now
        state.save()
    return state


def succeeded(namespace: str, name: str, uid: str) -> None:
    """Nothing left to try again (a row is written only when there was something to clear)."""
    ResolveState.objects.filter(namespace=namespace, name=name).exclude(failed_reason="").update(
        uid=uid, failed_reason="", failures=0, retry_at=None, secret_name="", secret_version=""
    )


def forget(namespace: str, name: str) -> None:
    """The artifact is gone."""
    ResolveState.objects.filter(namespace=namespace, name=name).delete()


def take_due(limit: int) -> list[tuple[str, str]]:
    """Failed artifacts whose time to try again came; each is leased for the longest backoff meanwhile (the
    attempt schedules the real next time)."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.RESOLVE_TERMINAL_RETRY_MAX)
    with transaction.atomic():
        due = list(
            ResolveState.objects.select_for_update(skip_locked=True)
            .filter(retry_at__lte=now)
            .exclude(failed_reason="")
            .order_by("retry_at")
            .values_list("pk", "namespace", "name")[:limit]
        )
        ResolveState.objects.filter(pk__in=[pk for pk, _, _ in due]).update(retry_at=lease)
    return [(ns, name) for _, ns, name in due]


def unscheduled(limit: int) -> list[tuple[str, str]]:
    """Mirrored artifacts whose last resolution failed for good but that no row schedules again (failed
    before these rows existed, or the row was lost): they are tried once, which schedules them."""
    scheduled = ResolveState.objects.filter(namespace=OuterRef("namespace"), name=OuterRef("name")).exclude(
        failed_reason=""
    )
    rows = (
        Artifact.objects.live()
        .filter(resolved_status=ConditionStatus.FALSE)
        .exclude(resolved_reason__in=RETRYABLE)
        .exclude(source="")
        .exclude(Exists(scheduled))
        .values_list("namespace", "name")[:limit]
    )
    return list(rows)


def never_resolved(limit: int, older_than_seconds: float = 120.0) -> list[tuple[str, str]]:
    """Mirrored artifacts that have no Resolved condition a while after they last changed: the resolution the
    mirror enqueued was lost (the broker restarted without its queue, or was down when the mirror sent it).
    Tried once more; an attempt that fails leaves a condition and its own schedule."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    rows = (
        Artifact.objects.live()
        .filter(resolved_status="", updated_at__lt=cutoff)
        .exclude(source="")
        .values_list("namespace", "name")[:limit]
    )
    return list(rows)


def secret_version(namespace: str, name: str) -> str | None:
    """The Secret's uid and resourceVersion ("" when it does not exist; None when it cannot be read)."""
    try:
        meta = kube.default().get(f"/api/v1/namespaces/{namespace}/secrets/{name}")["metadata"]
    except kube.NotFound:
        return ""
    except Exception:
        log.warning("reading Secret %s/%s", namespace, name, exc_info=True)
        return None
    return f"{meta.get('uid', '')}/{meta.get('resourceVersion', '')}"


def changed_secrets(limit: int) -> list[tuple[str, str]]:
    """Read the Secrets of up to ``limit`` failed artifacts (the longest unchecked first); the artifacts
    whose Secret changed since their failure."""
    rows = (
        ResolveState.objects.exclude(failed_reason="")
        .exclude(secret_name="")
        .order_by(F("secret_checked_at").asc(nulls_first=True))
        .values_list("pk", "namespace", "name", "secret_name", "secret_version")[:limit]
    )
    changed = []
    for pk, namespace, name, secret, seen in list(rows):
        version = secret_version(namespace, secret)
        if version is None:
            continue
        now = timezone.now()
        if version == seen:
            ResolveState.objects.filter(pk=pk).update(secret_checked_at=now)
            continue
        lease = now + timedelta(seconds=settings.RESOLVE_TERMINAL_RETRY_MAX)
        if (
            ResolveState.objects.filter(pk=pk, secret_version=seen)
            .exclude(failed_reason="")
            .update(secret_checked_at=now, secret_version=version, retry_at=lease)
        ):
            log.info("Secret %s/%s changed: resolving %s/%s again", namespace, secret, namespace, name)
            changed.append((namespace, name))
    return changed


def take_request(obj: dict) -> bool:
    """True once per new value of the artifact's ``requested-at`` annotation (the value is remembered)."""
    meta = obj.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(REQUESTED_AT) or ""
    if not value:
        return False
    with transaction.atomic():
        state = _locked(meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""))
        if state.requested_at == value:
            return False
        state.requested_at = value
        state.save(update_fields=["requested_at"])
    return True
