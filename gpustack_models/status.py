"""Errors as Kubernetes ``Status`` objects, with the reason and code kube-apiserver would give."""

from __future__ import annotations

import json
import logging

from django.http import HttpResponse
from rest_framework import exceptions as drf_exceptions

log = logging.getLogger(__name__)

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, message: str, reason: str | None = None, details: dict | None = None) -> dict:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, ""),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def status_response(code: int, message: str, reason: str | None = None, details: dict | None = None) -> HttpResponse:
    return HttpResponse(
        json.dumps(status_body(code, message, reason, details)), status=code, content_type="application/json"
    )


class StatusError(Exception):
    """Raised anywhere in a request; rendered as a ``Status`` with this code."""

    code = 500

    def __init__(self, message: str, *, code: int | None = None, reason: str | None = None, details=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.reason = reason or REASONS.get(self.code, "")
        self.details = details

    def response(self) -> HttpResponse:
        return status_response(self.code, self.message, self.reason, self.details)


class BadRequest(StatusError):
    code = 400


class Unauthorized(StatusError):
    code = 401


class Forbidden(StatusError):
    code = 403


class NotFound(StatusError):
    code = 404


class MethodNotAllowed(StatusError):
    code = 405


class NotAcceptable(StatusError):
    code = 406


class UnsupportedMediaType(StatusError):
    code = 415


class Invalid(StatusError):
    code = 422


def exception_handler(exc, context):
    """DRF exception handler: every error leaves as a Status object."""
    if isinstance(exc, StatusError):
        return exc.response()
    if isinstance(exc, drf_exceptions.APIException):  # DRF's own (401, 403, 405, 406, 415, 400, ...)
        return status_response(exc.status_code, str(exc.detail))
    log.exception("unhandled error in %s", context.get("view"))
    return status_response(500, f"internal error: {exc.__class__.__name__}")
