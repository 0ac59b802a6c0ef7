"""The Hugging Face resolver's pure parts, without a hub: a tree entry as the hub lists it becomes its manifest
line, the commit is read from the model info, the client's failures become the reasons a ModelArtifact
reports, and the hub's wait hint is read from its headers. Resolution against a hub: tests/test_sources.py."""

import hashlib

import httpx2
import pytest
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

from gpustack_models.sources import AccessDenied, InvalidManifest, ManifestFile, RevisionNotFound, SourceUnavailable
from gpustack_models.sources import huggingface as hf
from gpustack_models.sources.hub_errors import missing_repository

SHA = hashlib.sha256(b"weights").hexdigest()
POINTER_OID = "7" * 40
COMMIT = "0123456789abcdef0123456789abcdef01234567"

# Entries of ``GET /api/models/{id}/tree/{commit}?recursive=true``, as the hub answers them.
PLAIN = {"type": "file", "oid": "ce013625030ba8dba906f756967f9e9ca394464a", "size": 6, "path": "config.json"}
LFS = {
    "type": "file",
    "oid": POINTER_OID,
    "size": 7,
    "path": "model.safetensors",
    "lfs": {"oid": SHA, "size": 7, "pointerSize": 129},
}
XET = dict(LFS, xetHash="9" * 64)
XET_WITHOUT_LFS = {"type": "file", "oid": POINTER_OID, "size": 7, "path": "model.safetensors", "xetHash": "9" * 64}


def test_a_plain_file_is_named_by_its_git_blob_id():
    got = hf._manifest_file(RepoFile(**PLAIN))
    assert got == ManifestFile("config.json", 6, "gitsha1", PLAIN["oid"], lfs=False)


def test_an_lfs_file_is_named_by_the_sha256_of_its_content_not_its_pointer():
    got = hf._manifest_file(RepoFile(**LFS))
    assert got == ManifestFile("model.safetensors", 7, "sha256", SHA, lfs=True)


def test_a_xet_backed_file_gets_the_line_the_same_file_in_lfs_gets():
    assert hf._manifest_file(RepoFile(**XET)).line == hf._manifest_file(RepoFile(**LFS)).line


def test_a_xet_file_listed_without_its_sha256_cannot_be_named():
    with pytest.raises(ValueError, match="stored with Xet .* a Xet hash is not a content checksum"):
        hf._manifest_file(RepoFile(**XET_WITHOUT_LFS))


def test_an_unusable_path_in_the_tree_is_refused():
    with pytest.raises(ValueError):
        hf._manifest_file(RepoFile(**dict(PLAIN, path="../escape")))


def test_the_commit_is_the_model_infos_sha():
    assert hf._learn_commit(ModelInfo(id="org/model", sha=COMMIT, gated=False), "org/model@main") == COMMIT
    for sha in (None, "main", COMMIT[:12], COMMIT.upper()):
        with pytest.raises(SourceUnavailable, match="answered without a commit id"):
            hf._learn_commit(ModelInfo(id="org/model", sha=sha), "org/model@main")


def test_a_path_listed_twice_is_an_invalid_manifest():
    files = [hf._manifest_file(RepoFile(**PLAIN))] * 2
    with pytest.raises(InvalidManifest, match="listed 'config.json' twice"):
        hf._check_duplicates(files, "org/model@main")


def answer(status: int, **headers) -> httpx2.Response:
    return httpx2.Response(status, headers=headers, request=httpx2.Request("GET", "https://hub.example/api/models/x"))


def http_error(cls, status: int, server_message: str | None = None):
    return cls(f"{status} Client Error", response=answer(status), server_message=server_message)


WHERE = "org/model@main"


@pytest.mark.parametrize(
    "exc, token_given, expected, says",
    [
        (http_error(RepositoryNotFoundError, 404), False, AccessDenied, missing_repository(False) + " (HTTP 404)"),
        (http_error(RepositoryNotFoundError, 401, "Invalid credentials"), True, AccessDenied,
         missing_repository(True) + " (HTTP 401: Invalid credentials)"),
        (http_error(HfHubHTTPError, 404), True, AccessDenied, missing_repository(True)),
        (http_error(GatedRepoError, 403), True, AccessDenied, "gated and this token has not been granted access"),
        (http_error(DisabledRepoError, 403), False, AccessDenied, "access to the repository is disabled"),
        (http_error(RevisionNotFoundError, 404), False, RevisionNotFound, "no such branch, tag or commit"),
        (EntryNotFoundError("no tree"), False, RevisionNotFound, "the revision has no file tree"),
        (http_error(HfHubHTTPError, 403, "forbidden"), True, AccessDenied, "HTTP 403: forbidden"),
        (http_error(HfHubHTTPError, 418), False, SourceUnavailable, "unexpected HTTP 418"),
        (HFValidationError("bad id"), False, AccessDenied, "invalid repository id or revision: bad id"),
        (OfflineModeIsEnabled("offline"), False, SourceUnavailable, "HF_HUB_OFFLINE is set"),
        (httpx2.ConnectError("refused"), False, SourceUnavailable, "ConnectError: refused"),
        (KeyError("siblings"), False, SourceUnavailable, "unexpected answer from the hub: KeyError"),
    ],
)  # fmt: skip
def test_the_clients_failures_become_the_reasons_an_artifact_reports(exc, token_given, expected, says):
    with pytest.raises(expected) as raised, hf._hub_errors(WHERE, token_given):
        raise exc
    assert type(raised.value) is expected
    assert raised.value.message.startswith(f"{WHERE}: ") and says in raised.value.message


def test_what_the_transport_gave_up_on_is_unavailable_with_the_hubs_wait():
    with pytest.raises(SourceUnavailable) as raised, hf._hub_errors(WHERE, False):
        raise hf._HubUnavailable("GET https://hub.example/api/models/x answered HTTP 503", retry_after=7.0)
    assert raised.value.retry_after == 7.0 and "answered HTTP 503" in raised.value.message


def test_a_failure_that_is_not_the_hubs_is_not_hidden():
    with pytest.raises(ZeroDivisionError), hf._hub_errors(WHERE, False):
        raise ZeroDivisionError


@pytest.mark.parametrize(
    "status, headers, wait",
    [
        (503, {"Retry-After": "7"}, 7.0),
        (503, {}, None),
        (429, {"Retry-After": "2.5"}, 2.5),
        (429, {"RateLimit": '"api";r=0;t=55', "RateLimit-Policy": '"fixed window";"api";q=500;w=300'}, 55.0),
        (429, {"RateLimit": '"api";r=3;t=55'}, None),  # requests left: no wait named
        (503, {"RateLimit": '"api";r=0;t=55'}, None),  # a rate limit speaks for 429 only
        (429, {"Retry-After": "1", "RateLimit": '"api";r=0;t=55'}, 1.0),  # Retry-After first
    ],
)
def test_the_hubs_wait_is_its_retry_after_else_an_exhausted_rate_limits_reset(status, headers, wait):
    assert hf._retry_after(answer(status, **headers)) == wait


def test_resolution_needs_an_endpoint():
    with pytest.raises(ValueError, match="endpoint is required"):
        hf.resolve("org/model", endpoint="")
