"""The console's answer to a refused sign-in (django-axes' ``AXES_LOCKOUT_CALLABLE``): a page saying so and
until when, status 429 with ``Retry-After``, whether the password was right or not (it was never checked)."""

from __future__ import annotations

import math

from axes.models import AccessAttempt
from django.conf import settings
from django.contrib import admin
from django.db.models import Max
from django.template.response import TemplateResponse
from django.utils import timezone


def _retry_after(request, credentials) -> int:
    """Seconds until the refusal of this username from this address ends: the cool-off from its last counted
    failure (the whole cool-off when that is not found)."""
    username = (credentials or {}).get("username")
    last = AccessAttempt.objects.filter(
        username=username, ip_address=getattr(request, "axes_ip_address", None)
    ).aggregate(last=Max("attempt_time"))["last"]
    if last is None:
        return settings.CONSOLE_LOCKOUT_SECONDS
    left = (last + settings.AXES_COOLOFF_TIME - timezone.now()).total_seconds()
    return max(1, min(settings.CONSOLE_LOCKOUT_SECONDS, math.ceil(left)))


def locked_out(request, original_response=None, credentials=None):
    retry_after = _retry_after(request, credentials)
    context = {
        **admin.site.each_context(request),
        "title": "Sign-in refused",
        "retry_after": retry_after,
        "minutes": math.ceil(retry_after / 60),
        "failures": settings.CONSOLE_LOGIN_FAILURES,
    }
    response = TemplateResponse(request, "admin/console/locked_out.html", context, status=429)
    response["Retry-After"] = str(retry_after)
    return response.render()
