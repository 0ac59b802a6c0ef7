"""Resolve a ModelScope repository at a revision to its commit and the whole file list.

Uses the ``/api/v1`` transport of ``modelscope_hub`` (the client behind ``modelscope``'s
``snapshot_download`` and ``HubApi``), built here with the endpoint, token, proxy and CA bundle
passed explicitly: nothing is read from ``MODELSCOPE_ENDPOINT``, ``MODELSCOPE_API_TOKEN``, saved
credentials or the environment's proxy/CA variables, and nothing is written under the home
directory. Each request is a single attempt (the client's adapter retries are off): a 5xx, 429 or
network failure surfaces at once as ``SourceUnavailable`` and the caller retries with backoff.

The hub calls, in order:

1. ``GET /api/v1/models/{id}``: the repository exists and this token may read it;
2. ``GET /api/v1/models/{id}/revisions``: the branch or tag exists (skipped for a 40-hex commit);
3. ``GET /api/v1/models/{id}/repo/files?Revision=&Recursive=True``: every entry, and in
   ``Data.LatestCommitter.Id`` the commit the revision points at; further listings ask for that
   commit, so the file list is one consistent snapshot.

The revisions answer names branches and tags only (``Revision`` is the name, with ``CreatedAt``,
``CreatedBy``...): it carries no commit id, and the client reads none from it. The listing sometimes
leaves ``LatestCommitter`` out or its ``Id`` empty (``ShortId``, an abbreviated id, may remain). Then
the commit is learned from the files themselves: each entry's ``Revision`` (``CommitId`` too) is the
commit that last changed it, with its ``CommittedDate``. The likeliest one (matching ``ShortId``,
else the newest) is listed in turn; when it holds exactly the files listed at the revision, the
resolution is pinned to it. That is the revision's own commit unless its last commit changed no
listed file (an empty or merge commit), and in any case a commit with exactly this content. When no
commit qualifies (the files carry no commit ids; the revision's last commit deleted files, so no
file was last changed by it), the resolution is not pinned: ``ResolvedRevision.pinned`` is False, its
``commit`` the revision the files were listed at and its ``note`` says why. A branch or tag name is
never reported as a commit.

``repo/files`` has no pagination: it silently truncates at 3000 entries. A listing that comes back
with ``listing_limit`` entries is therefore treated as truncated: that directory is listed shallowly
and each sub-directory recursively, again and again, so nothing is lost. A single directory holding
``listing_limit`` direct entries cannot be listed completely through this API; resolution fails
rather than produce a manifest with files missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import uuid
from typing import Any

import requests
from modelscope_hub._legacy_api import LegacyClient
from modelscope_hub.errors import (
    APIError,
    AuthenticationError,
    HubError,
    InvalidParameter,
    NetworkError,
    NotExistError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
)
from modelscope_hub.utils import build_user_agent

from gpustack_models.sources.hub_errors import (
    ACCESS_DENIED,
    MISSING,
    REVISION_NOT_FOUND,
    AccessDenied,
    InvalidManifest,
    RevisionNotFound,
    SourceUnavailable,
    failure,
    known_revisions,
    missing_repository,
    modelscope_reason,
    retry_after_seconds,
)
from gpustack_models.sources.manifest import ManifestFile, ResolvedRevision, validate_path

DEFAULT_REVISION = "master"
# ModelScope's ``repo/files`` returns at most this many entries, whatever the directory holds.
DEFAULT_LISTING_LIMIT = 3000
# Bound on listing requests for one resolution (a pathological tree, or a hub ignoring ``Root``).
DEFAULT_MAX_LISTINGS = 2000

_COMMIT = re.compile(r"[0-9a-f]{40}")
# ``LatestCommitter.ShortId``: an abbreviated commit id.
_SHORT_ID = re.compile(r"[0-9a-f]{7,40}")
# At most this many commits of the listed files are listed to find the revision's commit.
MAX_COMMIT_CANDIDATES = 3
# Stable per process, so the client's user agent never needs the credentials directory.
_SESSION_ID = uuid.uuid4().hex


class _Hub:
    """One resolution's view of the ``/api/v1`` surface, errors mapped to ``Failure``."""

    def __init__(
        self,
        repository: str,
        *,
        endpoint: str,
        token: str | None,
        proxy: str | None,
        ca_bundle: str | None,
        timeout: float,
    ) -> None:
        self.repository = repository
        self.timeout = (float(timeout), float(timeout))
        self.client = LegacyClient(
            token=token or None,
            endpoint=endpoint.rstrip("/"),
            max_retries=0,
            user_agent=build_user_agent(session_id=_SESSION_ID, extra={"app": "gpustack-models"}),
        )
        # The client's two sessions: configure both the same, explicitly, ignoring the environment.
        for session in (self.client._session, self.client._read_session):
            session.trust_env = False
            session.verify = ca_bundle or True
            session.proxies = {"http": proxy, "https": proxy} if proxy else {}
        self.listings = 0
        self.denied = missing_repository(bool(token))

    def get(
        self,
        path: str,
        params: dict[str, Any] | None,
        *,
        what: str,
        on_missing: str,
        missing: str,
    ) -> Any:
        """GET an ``/api/v1`` path and return the envelope's ``Data``.

        ``what`` names the call in messages; a 404 or 400 (as an HTTP status or as the business code
        of a refused envelope) fails for the reason ``on_missing``, saying ``missing``.
        """
        with _client_errors(what, on_missing, missing, self.denied):
            response = self.client._request("GET", path, params=params, timeout=self.timeout, single_attempt=True)
            body = response.json()
        if not isinstance(body, dict):
            raise SourceUnavailable(f"{what}: unexpected answer from the hub")
        _check_envelope(body, what, on_missing, missing, self.denied)
        return body.get("Data")

    def check_readable(self) -> None:
        self.get(
            f"models/{self.repository}",
            None,
            what=f"{self.repository}: model info",
            on_missing=ACCESS_DENIED,
            missing=self.denied,
        )

    def revisions(self) -> tuple[list[str], list[str]]:
        """The repository's branch names and tag names."""
        data = self.get(
            f"models/{self.repository}/revisions",
            None,
            what=f"{self.repository}: revisions",
            on_missing=ACCESS_DENIED,
            missing=self.denied,
        )
        revision_map = data.get("RevisionMap") if isinstance(data, dict) else None
        if not isinstance(revision_map, dict):
            raise SourceUnavailable(f"{self.repository}: the revisions answer has no Data.RevisionMap")

        def names(group: str) -> list[str]:
            items = revision_map.get(group) or []
            return [i["Revision"] for i in items if isinstance(i, dict) and isinstance(i.get("Revision"), str)]

        return names("Branches"), names("Tags")

    def listing(self, revision: str, root: str | None, *, recursive: bool) -> dict[str, Any]:
        self.listings += 1
        params: dict[str, Any] = {"Revision": revision, "Recursive": str(recursive)}
        if root:
            params["Root"] = root
        where = f"{self.repository}@{revision}" + (f" under {root!r}" if root else "")
        data = self.get(
            f"models/{self.repository}/repo/files",
            params,
            what=f"{where}: file listing",
            on_missing=REVISION_NOT_FOUND,
            missing="no such revision or directory",
        )
        if not isinstance(data, dict) or not isinstance(data.get("Files"), list):
            raise SourceUnavailable(f"{where}: the file listing has no Data.Files")
        for entry in data["Files"]:
            path = _entry_path(entry)
            if root and not (path == root or path.startswith(root.rstrip("/") + "/")):
                raise InvalidManifest(f"{where}: the listing returned {path!r}, outside the requested directory")
        return data


# --------------------------------------------------------------------------------------------------
# Hub errors -> Failure (what a business code means: ``hub_errors.modelscope_reason``)
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _client_errors(what: str, on_missing: str, missing: str, denied: str):
    """Turn the client's failures inside the block (HTTP errors, network) into ``Failure``.

    The client reads statuses and business codes into its error classes; they mean what the same
    codes mean in a refused envelope (``_check_envelope``)."""
    try:
        yield
    except (RateLimitError, ServerError, NetworkError) as exc:
        retry_after = retry_after_seconds(getattr(exc, "retry_after", None))
        raise SourceUnavailable(f"{what}: {_first_line(exc)}", retry_after=retry_after) from None
    except (AuthenticationError, PermissionDeniedError) as exc:
        raise AccessDenied(f"{what}: {denied} ({_first_line(exc)})") from None
    except (NotExistError, InvalidParameter) as exc:
        raise failure(on_missing, f"{what}: {missing} ({_first_line(exc)})") from None
    except APIError as exc:
        raise SourceUnavailable(f"{what}: {_first_line(exc)}") from None
    except (HubError, requests.RequestException, ValueError) as exc:
        raise SourceUnavailable(f"{what}: {type(exc).__name__}: {_first_line(exc)}") from None


def _field(body: dict[str, Any], name: str, default: Any = None) -> Any:
    """An envelope field: ``Code`` on the ``/api/v1`` surface, ``code`` on the OpenAPI one."""
    if name in body:
        return body[name]
    return body.get(name.lower(), default)


def _check_envelope(body: dict[str, Any], what: str, on_missing: str, missing: str, denied: str) -> None:
    """Raise the ``Failure`` an envelope refusing the request (even with HTTP 200) means.

    An envelope is a refusal when ``Success`` is false or ``Code`` is not 200 (an absent ``Code``
    counts as 200). The business code decides what it means, see ``hub_errors.modelscope_reason``; a
    code it does not list (a server-side failure, a quota, anything new) is ``SourceUnavailable``,
    never a success.
    """
    code = _field(body, "Code", 200)
    if _field(body, "Success") is not False and str(code) == "200":
        return
    message = _field(body, "Message") or "no message"
    request_id = _field(body, "RequestId")
    detail = f"the hub refused with code {code}: {message}" + (f", request id {request_id}" if request_id else "")
    reason = modelscope_reason(code)
    if reason == ACCESS_DENIED:
        raise AccessDenied(f"{what}: {denied} ({detail})")
    if reason == MISSING:
        raise failure(on_missing, f"{what}: {missing} ({detail})")
    raise failure(reason, f"{what}: {detail}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _entry_path(entry: Any) -> str:
    if not isinstance(entry, dict):
        raise InvalidManifest(f"the hub listed a non-object entry: {entry!r}")
    path = entry.get("Path") or entry.get("Name")
    if not isinstance(path, str) or not path:
        raise InvalidManifest(f"the hub listed an entry without a path: {entry!r}")
    return path


def _is_directory(entry: dict[str, Any]) -> bool:
    return (entry.get("Type") or "blob") == "tree"


def _manifest_file(entry: dict[str, Any]) -> ManifestFile:
    path = validate_path(_entry_path(entry))
    sha256 = entry.get("Sha256")
    if not isinstance(sha256, str) or not sha256:
        raise ValueError(f"{path}: the hub listed no sha256")
    size = entry.get("Size")
    if isinstance(size, str) and size.isascii() and size.isdigit():
        size = int(size)
    return ManifestFile(path, size, "sha256", sha256, lfs=bool(entry.get("IsLFS")))


def _check_budget(hub: _Hub, revision: str, max_listings: int) -> None:
    if hub.listings >= max_listings:
        raise SourceUnavailable(
            f"{hub.repository}@{revision}: gave up after {hub.listings} listings of a truncated file tree"
        )


def _walk(hub: _Hub, revision: str, first: list[dict[str, Any]], limit: int, max_listings: int) -> list[dict]:
    """Every entry of the tree, re-listing per directory wherever a listing came back full."""
    collected: dict[str, dict[str, Any]] = {}

    def absorb(entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            collected.setdefault(_entry_path(entry), entry)

    pending: list[tuple[str | None, list[dict[str, Any]]]] = [(None, first)]
    while pending:
        root, entries = pending.pop()
        absorb(entries)
        if len(entries) < limit:
            continue
        _check_budget(hub, revision, max_listings)
        shallow = hub.listing(revision, root, recursive=False)["Files"]
        if len(shallow) >= limit:
            raise SourceUnavailable(
                f"{hub.repository}@{revision}: directory {root or '/'!r} holds {limit} or more entries, more than"
                " the hub lists in one answer; its file list cannot be complete"
            )
        absorb(shallow)
        for entry in shallow:
            if _is_directory(entry):
                _check_budget(hub, revision, max_listings)
                directory = _entry_path(entry)
                pending.append((directory, hub.listing(revision, directory, recursive=True)["Files"]))
    return list(collected.values())


def _check_arguments(repository: str, where: str, endpoint: str, listing_limit: int) -> None:
    if not endpoint:
        raise ValueError("endpoint is required")
    if listing_limit < 1:
        raise ValueError("listing_limit must be positive")
    if repository.count("/") != 1 or not all(repository.split("/")):
        raise AccessDenied(f"{where}: a ModelScope repository id is 'owner/name'")


def _check_revision(hub: _Hub, revision: str | None, repository: str) -> tuple[str, bool]:
    """The revision to list (unset: the repository's default branch, ``master`` as ModelScope's client
    assumes, else ``main``, else its only branch) and whether it is a commit id; a branch or tag name must
    be one the hub lists, or ``RevisionNotFound`` names those it does."""
    if revision and _COMMIT.fullmatch(revision):
        return revision, True
    branches, tags = hub.revisions()
    if not revision:
        fallback = [b for b in (DEFAULT_REVISION, "main") if b in branches] or (branches if len(branches) == 1 else [])
        revision = fallback[0] if fallback else DEFAULT_REVISION
    if revision not in branches and revision not in tags:
        known = known_revisions(branches, tags)
        raise RevisionNotFound(f"{repository}@{revision}: no such branch or tag{known}")
    return revision, False


def _named_commit(first: dict[str, Any], revision: str, is_commit: bool) -> str | None:
    """The commit the revision is: itself when a commit id, else the listing's ``LatestCommitter.Id``."""
    if is_commit:
        return revision
    latest = first.get("LatestCommitter")
    commit = str(latest.get("Id") or "").lower() if isinstance(latest, dict) else ""
    return commit if _COMMIT.fullmatch(commit) else None


def _entry_commit(entry: dict[str, Any]) -> str | None:
    """The commit that last changed a listed entry (its ``Revision``, or ``CommitId``), if it names one."""
    for key in ("Revision", "CommitId"):
        value = entry.get(key)
        if isinstance(value, str) and _COMMIT.fullmatch(value.lower()):
            return value.lower()
    return None


def _timestamp(value: Any) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _candidates(first: dict[str, Any], entries: list[dict[str, Any]]) -> list[str]:
    """The files' commits that may be the revision's: those ``LatestCommitter.ShortId`` abbreviates, else
    the newest (by ``CommittedDate``); at most ``MAX_COMMIT_CANDIDATES``, in a stable order."""
    dates: dict[str, int] = {}
    for entry in entries:
        commit = None if _is_directory(entry) else _entry_commit(entry)
        if commit:
            dates[commit] = max(dates.get(commit, -1), _timestamp(entry.get("CommittedDate")))
    latest = first.get("LatestCommitter")
    short = str(latest.get("ShortId") or "").lower() if isinstance(latest, dict) else ""
    named = [c for c in dates if _SHORT_ID.fullmatch(short) and c.startswith(short)]
    newest = max(dates.values(), default=-1)
    return sorted(named or [c for c, date in dates.items() if date == newest])[:MAX_COMMIT_CANDIDATES]


def _files_at(hub: _Hub, commit: str, limit: int, max_listings: int, where: str) -> list[ManifestFile] | None:
    """Every file at ``commit``; None when the hub knows no such commit or lists it unusably."""
    _check_budget(hub, commit, max_listings)
    try:
        first = hub.listing(commit, None, recursive=True)
        return _manifest_files(_walk(hub, commit, first["Files"], limit, max_listings), where)
    except (RevisionNotFound, InvalidManifest):
        return None


def _unpinned_note(repository: str, revision: str, candidates: list[str]) -> str:
    tried = ", ".join(c[:12] for c in candidates)
    if len(candidates) == 1:
        why = f"the newest commit its files name ({tried}) does not hold exactly these files"
    elif candidates:
        why = f"none of the newest commits its files name ({tried}) holds exactly these files"
    else:
        why = "its files carry no commit ids"
    return (
        f"ModelScope did not name the commit of {repository}@{revision}: its file listing has no"
        f" LatestCommitter.Id, and {why}. The files were listed at {revision!r} itself, which may move"
    )


def _resolve_unnamed(
    hub: _Hub, revision: str, first: dict[str, Any], limit: int, max_listings: int, where: str
) -> ResolvedRevision:
    """The revision's files, pinned to the commit of the files that holds exactly them, if any."""
    entries = _walk(hub, revision, first["Files"], limit, max_listings)
    files = _manifest_files(entries, where)
    candidates = _candidates(first, entries)
    for candidate in candidates:
        at_candidate = _files_at(hub, candidate, limit, max_listings, where)
        if at_candidate is not None and set(at_candidate) == set(files):
            return ResolvedRevision(commit=candidate, files=at_candidate)
    note = _unpinned_note(hub.repository, revision, candidates)
    return ResolvedRevision(commit=revision, files=files, pinned=False, note=note)


def _manifest_files(entries: list[dict[str, Any]], where: str) -> list[ManifestFile]:
    files: list[ManifestFile] = []
    for entry in entries:
        if _is_directory(entry):
            continue
        try:
            files.append(_manifest_file(entry))
        except ValueError as exc:
            raise InvalidManifest(f"{where}: {exc}") from None
    return files


def resolve(
    repository: str,
    revision: str | None = None,
    *,
    endpoint: str,
    token: str | None = None,
    proxy: str | None = None,
    ca_bundle: str | None = None,
    timeout: float = 30.0,
    listing_limit: int = DEFAULT_LISTING_LIMIT,
    max_listings: int = DEFAULT_MAX_LISTINGS,
) -> ResolvedRevision:
    """Turn ``revision`` (branch, tag or commit; unset: the repository's default branch, ``master`` as
    ModelScope's client assumes, else ``main``, else its only branch, named in the result's ``revision``)
    into its commit and list every file.

    ``endpoint`` is the hub's base URL (``https://modelscope.cn``, ``https://modelscope.ai`` or a
    mirror); ``token`` is the access token; ``proxy`` a proxy URL for both schemes; ``ca_bundle`` a
    PEM file replacing the default trust store; ``timeout`` bounds each connect and read, in seconds.
    ``listing_limit`` is the entry count at which the hub truncates a listing.

    The commit is the revision itself when 40 hex characters, else ``Data.LatestCommitter.Id`` of its
    listing; when the hub leaves that out, the commit of the listed files holding exactly them (see
    the module's docstring), else none: the result is then not ``pinned``.

    Raises ``AccessDenied``, ``RevisionNotFound``, ``SourceUnavailable`` (retryable) or
    ``InvalidManifest`` (an unusable path, a file without sha256). A refusal the hub answers with
    HTTP 200 (``Success: false`` and a business code) raises the same errors as its HTTP form.
    """
    asked = revision
    _check_arguments(repository, f"{repository}@{revision or DEFAULT_REVISION}", endpoint, listing_limit)

    hub = _Hub(repository, endpoint=endpoint, token=token, proxy=proxy, ca_bundle=ca_bundle, timeout=timeout)
    hub.check_readable()
    revision, is_commit = _check_revision(hub, revision, repository)
    where = f"{repository}@{revision}"
    first = hub.listing(revision, None, recursive=True)
    commit = _named_commit(first, revision, is_commit)
    if commit is None:
        resolved = _resolve_unnamed(hub, revision, first, listing_limit, max_listings, where)
    else:
        # Further listings (only when the first one was truncated) ask for the commit, not the branch.
        entries = _walk(hub, commit, first["Files"], listing_limit, max_listings)
        resolved = ResolvedRevision(commit=commit, files=_manifest_files(entries, where))
    return resolved if asked else dataclasses.replace(resolved, revision=revision)
