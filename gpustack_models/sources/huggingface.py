"""Resolve a Hugging Face repository at a revision to its commit and the whole file list.

Uses ``huggingface_hub``'s ``HfApi`` with everything passed explicitly: the endpoint (the client
reads ``HF_ENDPOINT`` once, at import), the token (``False`` when none, so no token saved on this
machine or in ``HF_TOKEN`` is ever sent), and the proxy, CA bundle and timeout of this call.

``huggingface_hub`` sends every request through one process-wide ``httpx2.Client``. This module
installs (once) a client factory whose transport routes each request by a context variable: inside
``resolve()`` requests use that call's proxy, CA bundle and timeout, never the environment's proxy
or CA variables; outside it the transport behaves as the client's default one (environment proxies
honoured), so other users of ``huggingface_hub`` in the process are not affected.

Inside ``resolve()`` the transport also turns 5xx and 429 answers and transport errors into an
immediate failure. Otherwise the client retries them on its own (the tree listing five times with
1, 2, 4, 8, 8 seconds of sleep, or ``Retry-After`` + 1 second per 429), which would hold a Celery worker
for minutes; the caller owns retrying, with backoff, through ``SourceUnavailable``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import contextlib
import re
import ssl
import threading
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpx2
from huggingface_hub import HfApi
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    DisabledRepoError,
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import ModelInfo, RepoFile
from huggingface_hub.utils import get_session, parse_ratelimit_headers, set_client_factory
from huggingface_hub.utils._http import hf_request_event_hook

from gpustack_models.sources.hub_errors import (
    ACCESS_DENIED,
    AccessDenied,
    Failure,
    InvalidManifest,
    RevisionNotFound,
    SourceUnavailable,
    api_reason,
    failure,
    known_revisions,
    missing_repository,
    retry_after_seconds,
    transient,
)
from gpustack_models.sources.manifest import ManifestFile, ResolvedRevision

hf_constants.HF_HUB_DISABLE_TELEMETRY = True

DEFAULT_REVISION = "main"
LIBRARY_NAME = "gpustack-models"

_COMMIT = re.compile(r"[0-9a-f]{40}")


# --------------------------------------------------------------------------------------------------
# Per-call HTTP settings for huggingface_hub's shared client
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _CallSettings:
    proxy: str | None
    ca_bundle: str | None
    timeout: float


_settings: ContextVar[_CallSettings | None] = ContextVar("gpustack_models_hf_call_settings", default=None)


class _HubUnavailable(Exception):
    """Raised by the transport inside ``resolve()``: not an httpx error, so the client does not retry it."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(response: httpx2.Response) -> float | None:
    """The hub's hint: its ``Retry-After``, else the reset time of an exhausted ``RateLimit``."""
    seconds = retry_after_seconds(response.headers.get("Retry-After"))
    if seconds is not None:
        return seconds
    if response.status_code == 429:
        limit = parse_ratelimit_headers(response.headers)
        if limit is not None and limit.remaining == 0:
            return float(limit.reset_in_seconds)
    return None


class _RoutingTransport(httpx2.BaseTransport):
    """Sends each request with the settings of the ``resolve()`` call it belongs to (see module doc)."""

    _MAX_TRANSPORTS = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._transports: OrderedDict[tuple[str | None, str | None], httpx2.HTTPTransport] = OrderedDict()
        # Same configuration as huggingface_hub's default client: environment proxies and CA honoured.
        self._ambient = httpx2.Client(trust_env=True)

    def _transport_for(self, settings: _CallSettings) -> httpx2.HTTPTransport:
        key = (settings.proxy, settings.ca_bundle)
        with self._lock:
            transport = self._transports.get(key)
            if transport is not None:
                self._transports.move_to_end(key)
                return transport
            verify: ssl.SSLContext | bool = (
                ssl.create_default_context(cafile=settings.ca_bundle) if settings.ca_bundle else True
            )
            transport = httpx2.HTTPTransport(verify=verify, trust_env=False, proxy=settings.proxy)
            self._transports[key] = transport
            while len(self._transports) > self._MAX_TRANSPORTS:
                # Not closed: another resolution may still be using it; its pool goes with the last reference.
                self._transports.popitem(last=False)
            return transport

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        settings = _settings.get()
        if settings is None:
            return self._ambient._transport_for_url(request.url).handle_request(request)
        request.extensions["timeout"] = httpx2.Timeout(settings.timeout).as_dict()
        try:
            response = self._transport_for(settings).handle_request(request)
        except httpx2.TransportError as exc:
            raise _HubUnavailable(
                f"{request.method} {request.url.copy_with(query=None)}: {type(exc).__name__}: {exc}"
            ) from exc
        if transient(response.status_code):
            try:
                response.read()
            except httpx2.HTTPError:
                pass
            finally:
                response.close()
            raise _HubUnavailable(
                f"{request.method} {request.url.copy_with(query=None)} answered HTTP {response.status_code}",
                retry_after=_retry_after(response),
            )
        return response

    def close(self) -> None:
        with self._lock:
            for transport in self._transports.values():
                transport.close()
            self._transports.clear()
        self._ambient.close()


_install_lock = threading.Lock()


def _client_factory() -> httpx2.Client:
    # As huggingface_hub's default factory, but with the routing transport (and no netrc or
    # environment lookups by the client itself: the transport decides).
    return httpx2.Client(
        event_hooks={"request": [hf_request_event_hook]},
        follow_redirects=True,
        timeout=None,
        transport=_RoutingTransport(),
        trust_env=False,
    )


def _ensure_client_factory() -> None:
    """Install the routing client factory, unless the shared client already uses it."""
    if isinstance(getattr(get_session(), "_transport", None), _RoutingTransport):
        return
    with _install_lock:
        if not isinstance(getattr(get_session(), "_transport", None), _RoutingTransport):
            set_client_factory(_client_factory)


@contextlib.contextmanager
def _call_settings(settings: _CallSettings):
    reset = _settings.set(settings)
    try:
        yield
    finally:
        _settings.reset(reset)


# --------------------------------------------------------------------------------------------------
# Hub errors -> Failure (what a status means: ``hub_errors``)
# --------------------------------------------------------------------------------------------------


def _refused(error: type[Failure], message: str) -> Callable[[Exception, str], Failure]:
    return lambda exc, where: error(f"{where}: {message}")


def _transport_failed(exc: _HubUnavailable, where: str) -> Failure:
    return SourceUnavailable(f"{where}: {exc}", retry_after=exc.retry_after)


def _http_refused(exc: HfHubHTTPError, where: str) -> Failure:
    status = exc.response.status_code if exc.response is not None else None
    reason = api_reason(status)
    if reason == ACCESS_DENIED:
        return AccessDenied(f"{where}: HTTP {status}: {exc.server_message or 'refused'}")
    return failure(reason, f"{where}: unexpected HTTP {status}: {exc.server_message or exc}")


# What each failure of the client means, first match wins (subclasses before their bases).
_HUB_ERRORS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], Callable[[Any, str], Failure]], ...] = (
    (_HubUnavailable, _transport_failed),
    (GatedRepoError, _refused(AccessDenied, "the repository is gated and this token has not been granted access")),
    (DisabledRepoError, _refused(AccessDenied, "access to the repository is disabled")),
    (RevisionNotFoundError, _refused(RevisionNotFound, "no such branch, tag or commit")),
    (EntryNotFoundError, _refused(RevisionNotFound, "the revision has no file tree")),
    (HfHubHTTPError, _http_refused),
    (HFValidationError, lambda exc, where: AccessDenied(f"{where}: invalid repository id or revision: {exc}")),
    (OfflineModeIsEnabled, _refused(SourceUnavailable, "HF_HUB_OFFLINE is set in this process")),
    (httpx2.HTTPError, lambda exc, where: SourceUnavailable(f"{where}: {type(exc).__name__}: {exc}")),
    # An answer that does not parse (JSON, missing field): treat as a broken hub or mirror.
    (
        (ValueError, KeyError, TypeError),
        lambda exc, where: SourceUnavailable(f"{where}: unexpected answer from the hub: {type(exc).__name__}: {exc}"),
    ),
)


def _missing_repository(exc: Exception, where: str, token_given: bool) -> Failure | None:
    """A repository the hub would not show (absent, or private to this caller), said for this caller."""
    if not isinstance(exc, HfHubHTTPError) or isinstance(exc, GatedRepoError):
        return None
    status = exc.response.status_code if exc.response is not None else None
    plain = type(exc) is HfHubHTTPError and status in (401, 404)  # not a more precise error of the client
    if not (plain or isinstance(exc, RepositoryNotFoundError)):
        return None
    detail = f" (HTTP {status}: {exc.server_message})" if exc.server_message else f" (HTTP {status})"
    return AccessDenied(f"{where}: {missing_repository(token_given)}{detail}")


def _source_error(exc: Exception, where: str, token_given: bool = False) -> Failure | None:
    missing = _missing_repository(exc, where, token_given)
    if missing is not None:
        return missing
    for types, to_source_error in _HUB_ERRORS:
        if isinstance(exc, types):
            return to_source_error(exc, where)
    return None


@contextlib.contextmanager
def _hub_errors(where: str, token_given: bool):
    """Turn the client's failures inside the block into the ``Failure`` they mean."""
    try:
        yield
    except Exception as exc:
        error = _source_error(exc, where, token_given)
        if error is None:
            raise
        raise error from None


# --------------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------------


def _manifest_file(entry: RepoFile) -> ManifestFile:
    """An LFS file (Xet-backed or not) is named by its LFS sha256, any other file by its git blob id.

    A Xet-backed file is an LFS file to git: the hub lists its ``lfs`` object (sha256, size) next to
    its ``xetHash``, so it gets exactly the line the same file stored in classic LFS gets. The Xet
    hash is no content checksum anyone can verify a download against, and the listed ``oid`` is the
    LFS pointer's, not the content's: without the ``lfs`` object the file cannot be named.
    """
    if entry.lfs is not None:
        return ManifestFile(entry.path, int(entry.lfs.size), "sha256", entry.lfs.sha256, lfs=True)
    if entry.xet_hash is not None:
        raise ValueError(
            f"{entry.path}: stored with Xet (xetHash {entry.xet_hash}) but listed without its LFS sha256;"
            " a Xet hash is not a content checksum, so the file cannot be part of a manifest"
        )
    return ManifestFile(entry.path, int(entry.size), "gitsha1", entry.blob_id, lfs=False)


def _learn_commit(info: ModelInfo, where: str) -> str:
    """The commit the revision points at, as the model info reports it."""
    commit = info.sha
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise SourceUnavailable(f"{where}: the hub answered without a commit id (sha={commit!r})")
    return commit


def _check_gated_access(api: HfApi, repository: str, info: ModelInfo) -> None:
    """Gated repositories list their files to anyone; only downloads are refused: ask the hub."""
    if info.gated:
        api.auth_check(repository)


def _list_tree(api: HfApi, repository: str, commit: str, where: str) -> list[ManifestFile]:
    """Every file of the repository at ``commit`` (all pages of the recursive tree listing)."""
    files: list[ManifestFile] = []
    for entry in api.list_repo_tree(repository, recursive=True, revision=commit):
        if not isinstance(entry, RepoFile):
            continue
        try:
            files.append(_manifest_file(entry))
        except ValueError as exc:
            raise InvalidManifest(f"{where}: {exc}") from None
    return files


def _check_duplicates(files: list[ManifestFile], where: str) -> None:
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise InvalidManifest(f"{where}: the hub listed {f.path!r} twice")
        seen.add(f.path)


def _known_revisions(api: HfApi, repository: str) -> str:
    """The repository's branches and tags, for the person fixing a revision; empty when the hub will not
    list them (the revision's own failure is what the status reports)."""
    try:
        refs = api.list_repo_refs(repository)
    except Exception:  # a best-effort detail of a message
        return ""
    return known_revisions([b.name for b in refs.branches], [t.name for t in refs.tags])


def resolve(
    repository: str,
    revision: str | None = DEFAULT_REVISION,
    *,
    endpoint: str,
    token: str | None = None,
    proxy: str | None = None,
    ca_bundle: str | None = None,
    timeout: float = 30.0,
) -> ResolvedRevision:
    """Turn ``revision`` (branch, tag or commit; default ``main``) into its commit and list every file.

    ``endpoint`` is the hub's base URL (``https://huggingface.co`` or a mirror). ``token`` is sent as
    a bearer token when given. ``proxy`` is a proxy URL for both schemes, ``ca_bundle`` a PEM file
    replacing the default trust store; neither is taken from the environment. ``timeout`` bounds
    every connect and read, in seconds.

    Raises ``AccessDenied`` (unknown repository, private without access, gated without access, bad
    token), ``RevisionNotFound``, ``SourceUnavailable`` (5xx, 429, network, timeout, proxy; retryable,
    with ``retry_after`` when the hub gave one) or ``InvalidManifest`` (the hub listed an unusable path,
    or a Xet file without its sha256).
    """
    if not endpoint:
        raise ValueError("endpoint is required")
    revision = revision or DEFAULT_REVISION
    _ensure_client_factory()
    api = HfApi(endpoint=endpoint.rstrip("/"), token=token or False, library_name=LIBRARY_NAME)
    where = f"{repository}@{revision}"
    with (
        _call_settings(_CallSettings(proxy or None, ca_bundle or None, float(timeout))),
        _hub_errors(where, bool(token)),
    ):
        try:
            info = api.model_info(repository, revision=revision, timeout=timeout, expand=["sha", "gated"])
        except RevisionNotFoundError:
            known = _known_revisions(api, repository)
            raise RevisionNotFound(f"{where}: no such branch, tag or commit{known}") from None
        commit = _learn_commit(info, where)
        _check_gated_access(api, repository, info)
        files = _list_tree(api, repository, commit, where)
    _check_duplicates(files, where)
    return ResolvedRevision(commit=commit, files=files)
