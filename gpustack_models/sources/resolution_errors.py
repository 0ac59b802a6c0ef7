"""Why resolving a hub source failed, as the reasons the artifact's status reports.

Every failure of the hub side of resolution is a ``SourceError`` carrying ``reason`` (the condition
reason written to a ModelArtifact) and a human message. ``retryable`` says whether the caller should
try again later with backoff (only ``SourceUnavailable``); ``retry_after`` carries the hub's own
``Retry-After`` hint, in seconds, when it gave one.
"""

from __future__ import annotations

REVISION_NOT_FOUND = "RevisionNotFound"
ACCESS_DENIED = "AccessDenied"
SOURCE_UNAVAILABLE = "SourceUnavailable"
EMPTY_MANIFEST = "EmptyManifest"
INVALID_MANIFEST = "InvalidManifest"


class SourceError(Exception):
    """A hub source could not be resolved; ``reason`` is the status reason to report."""

    retryable = False

    def __init__(self, reason: str, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason!r}, {self.message!r})"


class RevisionNotFound(SourceError):
    """The repository exists and is readable, but the branch, tag or commit does not."""

    def __init__(self, message: str):
        super().__init__(REVISION_NOT_FOUND, message)


class AccessDenied(SourceError):
    """Unknown repository, private without (or with a wrong) token, gated without access.

    A hub answers these alike on purpose (a private repository looks absent to a stranger), so they
    share one reason.
    """

    def __init__(self, message: str):
        super().__init__(ACCESS_DENIED, message)


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


class SourceUnavailable(SourceError):
    """The hub did not answer usefully right now: 5xx, 429, timeout, connection or proxy failure.

    Retry with backoff; never revoke an earlier successful resolution because of it.
    """

    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(SOURCE_UNAVAILABLE, message, retry_after=retry_after)


class EmptyManifest(SourceError):
    """The allow/ignore patterns (or an empty repository) leave no file to download."""

    def __init__(self, message: str):
        super().__init__(EMPTY_MANIFEST, message)


class InvalidManifest(SourceError):
    """The hub listed something that cannot be part of a manifest.

    For example a path with an empty, ``.`` or ``..`` segment, a duplicate path, or a file without
    the checksum the manifest needs. Retrying does not help until the repository changes.
    """

    def __init__(self, message: str):
        super().__init__(INVALID_MANIFEST, message)
