"""What a hub's answers mean, and the one failure type of resolution, downloads and peers.

No Django, no Kubernetes and no hub client here: the callers hand over a status, a code or a header.

A ``Failure`` carries a ``reason`` (the condition reason a status reports), a human ``message`` and,
when the hub gave one, its ``Retry-After`` hint in seconds (``retry_after``). The reasons:

- a ModelArtifact reports why resolving it failed: ``AccessDenied``, ``RevisionNotFound``,
  ``SourceUnavailable`` (the only retryable one), ``EmptyManifest``, ``InvalidManifest``; each has its
  own class (``raise RevisionNotFound(message)``), and ``SourceError`` is resolution's name for the type;
- a NodeModelStore reports why a download on its node failed (``DownloadFailed``, in the engine's
  ``failures``): ``InvalidRequest``, ``AccessDenied``, ``SourceUnavailable``, ``IntegrityMismatch``,
  ``InsufficientCapacity``, ``Canceled``.

What an HTTP status means depends on what was asked; each kind of request has its table here:

- ``api_reason``: a hub's API (a model's info, its revisions, its file listing);
- ``file_reason``: a hub's file, asked for a byte range;
- ``peer_reason``: another node's plugin, asked for its tree or for a byte range; two answers are a
  peer's own: ``NOT_HELD`` (it holds nothing, or not that range) and ``BUSY`` (ask again after its
  ``Retry-After``);
- ``modelscope_reason``: the code of a refusal ModelScope answers even with HTTP 200;
- ``transient``: 429 and any 5xx, worth asking a hub again shortly where the caller retries.

``retry_after_seconds`` reads a ``Retry-After`` value, ``error_code_detail`` a hub's ``X-Error-Code``.
"""

from __future__ import annotations

import math
import time
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import ClassVar

REVISION_NOT_FOUND = "RevisionNotFound"
ACCESS_DENIED = "AccessDenied"
SOURCE_UNAVAILABLE = "SourceUnavailable"
EMPTY_MANIFEST = "EmptyManifest"
INVALID_MANIFEST = "InvalidManifest"
INVALID_REQUEST = "InvalidRequest"
INTEGRITY_MISMATCH = "IntegrityMismatch"
INSUFFICIENT_CAPACITY = "InsufficientCapacity"
CANCELED = "Canceled"

# A peer's own answers (never a failure's reason: another source takes over).
NOT_HELD = "NotHeld"
BUSY = "Busy"
# In ModelScope's table: what was asked for is absent; the caller names the reason (``AccessDenied`` for
# a repository, ``RevisionNotFound`` for a listing at a revision).
MISSING = "Missing"

# A hub's API. 429 and 5xx are ``transient``; anything else not listed is an unexpected answer.
_HUB_API = {401: ACCESS_DENIED, 403: ACCESS_DENIED, 404: ACCESS_DENIED}
# A hub's file, asked for ``Range: bytes=a-b``. 416: the hub's file is shorter than the manifest says.
_HUB_FILE = {
    400: INVALID_REQUEST,
    401: ACCESS_DENIED,
    403: ACCESS_DENIED,
    404: ACCESS_DENIED,
    410: ACCESS_DENIED,
    416: INTEGRITY_MISMATCH,
    422: INVALID_REQUEST,
}
# A peer's tree (404: it holds nothing yet) and a peer's byte range (416: it does not hold the range).
_PEER_TREE = {401: ACCESS_DENIED, 403: ACCESS_DENIED, 404: NOT_HELD, 503: BUSY}
_PEER_RANGE = {401: ACCESS_DENIED, 403: ACCESS_DENIED, 404: ACCESS_DENIED, 416: NOT_HELD, 503: BUSY}
# ModelScope answers many refusals with HTTP 200 and ``{"Code": <business code>, "Message", "RequestId",
# "Success": false}``; modelscope_hub reads these codes (its ``errors`` module) as: HTTP statuses echoed
# by the ``/api/v1`` surface, numeric business codes, and the OpenAPI surface's names. Any code not
# listed, the client's retryable ones (429, 5xx, ``RateLimitExceed``) included, is ``SourceUnavailable``.
_MODELSCOPE_CODES = {
    "401": ACCESS_DENIED,
    "403": ACCESS_DENIED,
    "10010103009": ACCESS_DENIED,  # AccessToken is invalid or expired
    "InvalidAuthentication": ACCESS_DENIED,
    "OperationNotAllowed": ACCESS_DENIED,
    "400": MISSING,
    "404": MISSING,
    "InputParameterError": MISSING,
    "ResourceNotFound": MISSING,
}


def transient(status: int) -> bool:
    """A status worth asking a hub again shortly: 429 (too many requests) and any 5xx."""
    return status == 429 or status >= 500


def api_reason(status: int | None) -> str:
    """The reason of a hub API answer that is not a success (``None``: no answer at all)."""
    return _HUB_API.get(status, SOURCE_UNAVAILABLE)


def file_reason(status: int) -> str:
    """The reason of a hub's answer, other than 200 or 206, to a byte range of a file."""
    return _HUB_FILE.get(status, SOURCE_UNAVAILABLE)


def peer_reason(status: int, *, tree: bool = False) -> str:
    """What a peer's answer (other than 200 to a tree, 206 to a range) means: ``ACCESS_DENIED`` (it
    refused us), ``NOT_HELD``, ``BUSY``, else ``SOURCE_UNAVAILABLE`` (a failure counted against it)."""
    return (_PEER_TREE if tree else _PEER_RANGE).get(status, SOURCE_UNAVAILABLE)


def modelscope_reason(code: object) -> str:
    """The reason of a ModelScope refusal with business ``code``: ``MISSING`` when it says that what
    was asked for is absent (the caller knows which reason that is)."""
    return _MODELSCOPE_CODES.get(str(code).strip(), SOURCE_UNAVAILABLE)


def retry_after_seconds(value: str | float | None, *, now: float | None = None) -> float | None:
    """The wait, in seconds, a ``Retry-After`` value asks for; None when there is none to read.

    Either form of the header: delay-seconds (a decimal number too, as hubs send) or an HTTP-date (the
    seconds from ``now``, default the current time, until then; 0 once it is past). A number already
    read (as a hub client hands it over) is taken as seconds. Garbage, a negative number and NaN give
    None; a huge number is returned as it is (callers cap their waits).
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float
            seconds = math.inf
    else:
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            return _until(text, time.time() if now is None else now)
    return seconds if seconds >= 0 else None


def _until(date: str, now: float) -> float | None:
    """Seconds from ``now`` until an HTTP-date (0 when past), None when ``date`` is not one."""
    try:
        when = parsedate_to_datetime(date)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, as every HTTP-date is
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)


def error_code_detail(code: str | None) -> str:
    """`` (<code>)`` for a hub's ``X-Error-Code``, to append to a message; empty when none is usable.

    Only the code: a hub's free-text error message may name the repository."""
    return f" ({code[:64]})" if code and code.isprintable() else ""


def known_revisions(branches: list[str], tags: list[str], shown: int = 10) -> str:
    """`` (branches: main, dev; tags: v1)``, the revisions a repository does have, to append to a
    ``RevisionNotFound`` message; at most ``shown`` of each, sorted; empty when the hub lists none."""

    def listed(names: list[str]) -> str:
        names = sorted(n for n in names if n.isprintable())
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        return ", ".join(names[:shown]) + more

    said = [f"{group}: {listed(names)}" for group, names in (("branches", branches), ("tags", tags)) if names]
    return f" ({'; '.join(said)})" if said else ""


def missing_repository(token_given: bool) -> str:
    """What a hub's "no such repository" means to the person who wrote the artifact.

    A hub answers a private repository it will not show exactly as one that does not exist, so the
    message names both, and says which credential was (or was not) shown to it."""
    if token_given:
        return "the repository does not exist, or the token given has no access to it"
    return (
        "the repository does not exist, or it is private and no token was given"
        " (name a Secret holding a hub token, key 'token', in secretRef)"
    )


class Failure(Exception):
    """Resolving, or downloading, failed for ``reason``; ``message`` is for humans.

    ``retry_after`` carries the hub's own ``Retry-After`` hint (seconds) when it gave one. ``retryable``:
    the hub did not answer usefully right now (``SourceUnavailable``): ask again later, with backoff.
    """

    def __init__(self, reason: str, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.reason == SOURCE_UNAVAILABLE

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason!r}, {self.message!r})"


# Resolution's name for the failure type: a hub source could not be resolved.
SourceError = Failure


class _Reasoned(Failure):
    """A failure whose class names its reason: ``raise RevisionNotFound(message)``."""

    REASON: ClassVar[str]

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(self.REASON, message, retry_after=retry_after)


class RevisionNotFound(_Reasoned):
    """The repository exists and is readable, but the branch, tag or commit does not."""

    REASON = REVISION_NOT_FOUND


class AccessDenied(_Reasoned):
    """Unknown repository, private without (or with a wrong) token, gated without access.

    A hub answers these alike on purpose (a private repository looks absent to a stranger), so they
    share one reason.
    """

    REASON = ACCESS_DENIED


class SourceUnavailable(_Reasoned):
    """The hub did not answer usefully right now: 5xx, 429, timeout, connection or proxy failure.

    Retry with backoff; never revoke an earlier successful resolution because of it.
    """

    REASON = SOURCE_UNAVAILABLE


class EmptyManifest(_Reasoned):
    """The allow/ignore patterns (or an empty repository) leave no file to download."""

    REASON = EMPTY_MANIFEST


class InvalidManifest(_Reasoned):
    """The hub listed something that cannot be part of a manifest.

    For example a path with an empty, ``.`` or ``..`` segment, a duplicate path, or a file without
    the checksum the manifest needs. Retrying does not help until the repository changes.
    """

    REASON = INVALID_MANIFEST


_CLASSES: dict[str, type[_Reasoned]] = {
    cls.REASON: cls for cls in (RevisionNotFound, AccessDenied, SourceUnavailable, EmptyManifest, InvalidManifest)
}


def failure(reason: str, message: str, *, retry_after: float | None = None) -> Failure:
    """A failure for ``reason``: of the class named after it when there is one (``AccessDenied``...)."""
    cls = _CLASSES.get(reason)
    if cls is None:
        return Failure(reason, message, retry_after=retry_after)
    return cls(message, retry_after=retry_after)
