"""Kubernetes errors as exception classes, made once at the client edge.

Every non-2xx answer of kube-apiserver becomes the ``StatusError`` subclass of its reason (``NotFound``,
``Conflict``, ``Expired`` ...), carrying the ``Status`` object it sent, so callers write
``except kube.NotFound`` and never compare status codes. The aggregated API raises the same classes
for the errors it answers itself, and renders any of them as a ``Status``.
"""

from __future__ import annotations

import json

import urllib3

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, message: str, reason: str | None = None, details: dict | None = None) -> dict:
    """A ``Status`` object with kube-apiserver's reason for ``code``."""
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


class StatusError(Exception):
    """A Kubernetes ``Status`` failure: from kube-apiserver (``body`` is what it sent) or our own."""

    code = 500
    reason = "InternalError"

    def __init__(
        self,
        message: str = "",
        *,
        code: int | None = None,
        reason: str | None = None,
        details: dict | None = None,
        body: dict | None = None,
    ):
        if code is not None:
            self.code = code
        self.reason = reason or (body or {}).get("reason") or REASONS.get(self.code, type(self).reason)
        self.message = message or (body or {}).get("message", "")
        self.details = details if details is not None else (body or {}).get("details")
        self.body = body
        super().__init__(f"{self.code} {self.reason}: {self.message}")

    @property
    def status(self) -> int:
        return self.code

    def to_status(self) -> dict:
        """The ``Status`` object: kube-apiserver's own when it sent one."""
        if self.body and self.body.get("kind") == "Status":
            return self.body
        return status_body(self.code, self.message, self.reason, self.details)


class BadRequest(StatusError):
    code, reason = 400, "BadRequest"


class Unauthorized(StatusError):
    code, reason = 401, "Unauthorized"


class Forbidden(StatusError):
    code, reason = 403, "Forbidden"


class NotFound(StatusError):
    code, reason = 404, "NotFound"


class MethodNotAllowed(StatusError):
    code, reason = 405, "MethodNotAllowed"


class NotAcceptable(StatusError):
    code, reason = 406, "NotAcceptable"


class Conflict(StatusError):
    code, reason = 409, "Conflict"

    @property
    def being_deleted(self) -> bool:
        """The object has a deletionTimestamp: a write that would recreate it has to wait."""
        return "being deleted" in self.message


class AlreadyExists(Conflict):
    reason = "AlreadyExists"


class StillConflicting(Conflict):
    """Ours, not kube-apiserver's: a write that lost to another writer each time it read and tried again, as
    many times as it tries at once. Unlike a conflict that stays, worth the whole write again a moment later."""


class Expired(StatusError):
    """The resourceVersion is too old (410): list again."""

    code, reason = 410, "Expired"


class RequestEntityTooLarge(StatusError):
    code, reason = 413, "RequestEntityTooLarge"


class UnsupportedMediaType(StatusError):
    code, reason = 415, "UnsupportedMediaType"


class Invalid(StatusError):
    code, reason = 422, "Invalid"


class TooManyRequests(StatusError):
    code, reason = 429, "TooManyRequests"


class InternalError(StatusError):
    code, reason = 500, "InternalError"


class ServiceUnavailable(StatusError):
    code, reason = 503, "ServiceUnavailable"


class Timeout(StatusError):
    code, reason = 504, "Timeout"


# What kube-apiserver fails with while it restarts or sheds load (no connection, a connection cut, 429, 503,
# 504): worth the same request again a moment later.
UNREACHABLE = (urllib3.exceptions.HTTPError, ConnectionError, TooManyRequests, ServiceUnavailable, Timeout)
# ... and, for a moment after it starts, 401 and 403 before its authentication and RBAC caches are filled:
# what a controller tries again (a bounded number of times: a real refusal stays one).
STARTING = (*UNREACHABLE, Unauthorized, Forbidden)


_BY_CODE = {
    cls.code: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        NotAcceptable,
        Conflict,
        Expired,
        RequestEntityTooLarge,
        UnsupportedMediaType,
        Invalid,
        TooManyRequests,
        InternalError,
        ServiceUnavailable,
        Timeout,
    )
}


def error_for(code: int, body: bytes | dict | None = None) -> StatusError:
    """The exception for an answer of kube-apiserver with status ``code``."""
    if isinstance(body, (bytes, bytearray)):
        try:
            body = json.loads(body)
        except ValueError:
            body = {"message": body.decode(errors="replace")[:500]}
    body = body if isinstance(body, dict) else {}
    if code == 409 and body.get("reason") == "AlreadyExists":
        return AlreadyExists(body=body)
    cls = _BY_CODE.get(code, StatusError)
    if cls is StatusError:
        return StatusError(code=code, body=body)
    return cls(body=body)
