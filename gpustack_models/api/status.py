"""Every error of the aggregated API leaves as a Kubernetes ``Status``, through one DRF exception handler.

Views raise the error classes of ``gpustack_models.kube.errors`` (the same ones the client raises for
kube-apiserver's answers, so a storage error passes through with its own reason, message and causes,
told at v1). DRF's own exceptions (a body type no parser takes, an unsupported method) map to the
Kubernetes reason of their status code.
"""

from __future__ import annotations

import logging

import orjson
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from rest_framework import exceptions as drf

from gpustack_models.api.conversion import public_status
from gpustack_models.kube.errors import (
    BadRequest,
    Forbidden,
    MethodNotAllowed,
    NotAcceptable,
    NotFound,
    RequestEntityTooLarge,
    StatusError,
    Unauthorized,
    UnsupportedMediaType,
    status_body,
)

log = logging.getLogger(__name__)

_DRF_ERRORS = (
    (drf.UnsupportedMediaType, UnsupportedMediaType),
    (drf.NotAcceptable, NotAcceptable),
    (drf.MethodNotAllowed, MethodNotAllowed),
    (drf.NotAuthenticated, Unauthorized),
    (drf.AuthenticationFailed, Unauthorized),
    (drf.PermissionDenied, Forbidden),
    (drf.NotFound, NotFound),
    (drf.ParseError, BadRequest),
)


def status_response(status: dict) -> HttpResponse:
    return HttpResponse(orjson.dumps(status), status=status["code"], content_type="application/json")


def not_found() -> NotFound:
    return NotFound("the server could not find the requested resource")


def _from_drf(exc: drf.APIException, view) -> StatusError:
    if isinstance(exc, drf.UnsupportedMediaType) and view is not None:
        accepted = ", ".join(parser.media_type for parser in view.get_parsers())
        return UnsupportedMediaType(
            f"the body of the request was in an unknown format - accepted media types include: {accepted}"
        )
    if isinstance(exc, drf.MethodNotAllowed) and view is not None:
        return MethodNotAllowed(f"the server does not allow this method on the requested resource: {exc.detail}")
    for drf_class, status_class in _DRF_ERRORS:
        if isinstance(exc, drf_class):
            return status_class(str(exc.detail))
    return StatusError(str(exc.detail), code=exc.status_code)


def exception_handler(exc, context):
    """DRF's exception handler: the ``Status`` of ``exc`` (a 500 ``Status`` for anything unexpected)."""
    view = context.get("view")
    if isinstance(exc, drf.APIException):
        exc = _from_drf(exc, view)
    elif isinstance(exc, RequestDataTooBig):
        exc = RequestEntityTooLarge("the request body is too large")
    if isinstance(exc, StatusError):
        return status_response(public_status(exc.to_status()))
    log.exception("unhandled error in %s", type(view).__name__ if view is not None else "a view")
    return status_response(status_body(500, f"internal error: {type(exc).__name__}"))
