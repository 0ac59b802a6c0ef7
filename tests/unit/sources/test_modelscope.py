"""The ModelScope resolver's pure parts, without a hub: an envelope refusing a request (even with HTTP 200)
means the reason its business code names, a listing's entries become manifest lines, and the commit is
read from ``LatestCommitter`` or, when the hub leaves it out, guessed from the files' own commits.
Resolution against a hub: tests/test_sources.py."""

import hashlib

import pytest

from gpustack_models.sources import AccessDenied, InvalidManifest, ManifestFile, RevisionNotFound, SourceUnavailable
from gpustack_models.sources import modelscope as ms
from gpustack_models.sources.hub_errors import ACCESS_DENIED, REVISION_NOT_FOUND

SHA = hashlib.sha256(b"weights").hexdigest()
OLD, NEW, NEWER = "1" * 40, "2" * 40, "3" * 40
WHERE = "qwen/model@master"
DENIED = "the repository does not exist, or the token given has no access to it"


def entry(path, commit=None, date=None, **fields):
    """One entry of ``GET /api/v1/models/{id}/repo/files``, as the hub lists it."""
    out = {"Name": path.rsplit("/", 1)[-1], "Path": path, "Type": "blob", "Size": 7, "Sha256": SHA, "IsLFS": True}
    if commit:
        out |= {"Revision": commit, "CommitId": commit, "CommitMessage": "m", "CommittedDate": date}
    return out | fields


def listing(files, latest=None):
    """The listing's ``Data``, ``LatestCommitter`` as the hub writes it (or left out)."""
    data = {"Files": files, "IsVisual": 0}
    if latest is not None:
        data["LatestCommitter"] = latest
    return data


def refusal(body, on_missing=ACCESS_DENIED, missing=DENIED):
    with pytest.raises(Exception) as raised:
        ms._check_envelope(body, WHERE, on_missing, missing, DENIED)
    return raised.value


@pytest.mark.parametrize(
    "body",
    [
        {"Code": 200, "Data": {}, "Message": "success", "RequestId": "r", "Success": True},
        {"code": 200, "data": {}, "success": True},  # the OpenAPI surface's spelling
        {"Data": {}},  # no Code: 200
    ],
)
def test_an_envelope_of_success_passes(body):
    assert ms._check_envelope(body, WHERE, ACCESS_DENIED, DENIED, DENIED) is None


def test_a_refusal_with_http_200_means_what_its_business_code_says():
    token = refusal({"Code": 10010103009, "Message": "AccessToken is invalid", "RequestId": "r-1", "Success": False})
    assert type(token) is AccessDenied
    detail = "the hub refused with code 10010103009: AccessToken is invalid, request id r-1"
    assert token.message == f"{WHERE}: {DENIED} ({detail})"
    repository = refusal({"Code": 404, "Message": "model not found", "Success": False})
    assert type(repository) is AccessDenied and "model not found" in repository.message
    revision = refusal({"Code": "ResourceNotFound", "Success": False}, REVISION_NOT_FOUND, "no such revision")
    assert type(revision) is RevisionNotFound and revision.message.startswith(f"{WHERE}: no such revision (")
    lower = refusal({"code": 403, "message": "forbidden"})  # the OpenAPI surface's spelling, no success field
    assert type(lower) is AccessDenied and lower.message.endswith("code 403: forbidden)")


@pytest.mark.parametrize(
    "body",
    [
        {"Code": "RateLimitExceed", "Success": False},
        {"Code": 500, "Message": "internal", "Success": False},
        {"Code": 10030000001, "Success": False},  # a code no table lists: never a success
        {"Code": 200, "Success": False},
    ],
)
def test_any_other_refusal_is_worth_asking_again(body):
    got = refusal(body)
    assert type(got) is SourceUnavailable and "the hub refused with code" in got.message


def test_an_entry_becomes_its_manifest_line():
    assert ms._manifest_file(entry("model.bin", Size="7")) == ManifestFile("model.bin", 7, "sha256", SHA, lfs=True)
    assert ms._manifest_file(entry("a/b.json", IsLFS=False)).lfs is False
    named = {"Name": "config.json", "Type": "blob", "Size": 7, "Sha256": SHA}  # no Path: its Name
    assert ms._manifest_file(named).path == "config.json"
    with pytest.raises(ValueError, match="listed no sha256"):
        ms._manifest_file(entry("model.bin", Sha256=""))


@pytest.mark.parametrize("bad", ["a string", {"Type": "blob", "Sha256": SHA}, {"Path": "", "Name": ""}])
def test_an_entry_without_a_path_is_an_invalid_manifest(bad):
    with pytest.raises(InvalidManifest):
        ms._entry_path(bad)


def test_the_files_of_a_listing_leave_out_directories_and_refuse_unusable_entries():
    entries = [entry("dir", Type="tree", Sha256="", Size=0), entry("dir/a.bin"), entry("b.bin")]
    assert [f.path for f in ms._manifest_files(entries, WHERE)] == ["dir/a.bin", "b.bin"]
    with pytest.raises(InvalidManifest) as raised:
        ms._manifest_files([entry("c.bin", Sha256=None)], WHERE)
    assert raised.value.message == f"{WHERE}: c.bin: the hub listed no sha256"
    with pytest.raises(InvalidManifest):
        ms._manifest_files([entry("../c.bin")], WHERE)


def test_the_revisions_commit_is_itself_or_the_listings_latest_committer():
    assert ms._named_commit(listing([]), NEW, is_commit=True) == NEW
    assert ms._named_commit(listing([], {"Id": NEW.upper(), "ShortId": NEW[:8]}), "master", False) == NEW
    for latest in (None, {"Id": "", "ShortId": NEW[:8]}, {"ShortId": NEW[:8]}, {"Id": NEW[:12]}, "x"):
        assert ms._named_commit(listing([], latest), "master", False) is None


def test_an_entry_names_the_commit_that_last_changed_it():
    assert ms._entry_commit(entry("a", NEW)) == NEW
    assert ms._entry_commit({"CommitId": NEW.upper()}) == NEW
    assert ms._entry_commit({"Revision": "master", "CommitId": OLD}) == OLD
    assert ms._entry_commit(entry("a")) is None


@pytest.mark.parametrize("value, seconds", [(1700000000, 1700000000), ("1700000000", 1700000000), (None, -1),
                                            (True, -1), ("soon", -1), (1.5, -1)])  # fmt: skip
def test_a_commit_date_is_read_from_a_number_or_its_digits(value, seconds):
    assert ms._timestamp(value) == seconds


def test_the_candidates_are_the_commits_the_short_id_abbreviates():
    entries = [entry("a", OLD, 1), entry("b", NEW, 2), entry("c", NEWER, 3)]
    assert ms._candidates(listing(entries, {"Id": "", "ShortId": NEW[:8]}), entries) == [NEW]


def test_without_a_short_id_the_candidates_are_the_newest_commits():
    entries = [entry("a", OLD, 1), entry("b", NEW, 5), entry("c", NEWER, 5), entry("d", OLD, 2)]
    assert ms._candidates(listing(entries), entries) == [NEW, NEWER]
    directory = entry("dir", "4" * 40, 9, Type="tree")  # a directory's commit is not a file's
    assert ms._candidates(listing(entries + [directory]), entries + [directory]) == [NEW, NEWER]
    many = [entry(str(i), str(i) * 40, 7) for i in range(5, 10)]
    assert ms._candidates(listing(many), many) == ["5" * 40, "6" * 40, "7" * 40]  # at most three
    assert ms._candidates(listing([entry("a")]), [entry("a")]) == []


def test_an_unpinned_resolution_says_which_commits_were_tried():
    one = ms._unpinned_note("qwen/model", "master", [NEW])
    assert one.startswith("ModelScope did not name the commit of qwen/model@master: its file listing has no")
    assert f"the newest commit its files name ({NEW[:12]}) does not hold exactly these files" in one
    assert one.endswith("The files were listed at 'master' itself, which may move")
    several = ms._unpinned_note("qwen/model", "master", [NEW, NEWER])
    assert f"none of the newest commits its files name ({NEW[:12]}, {NEWER[:12]})" in several
    assert "its files carry no commit ids" in ms._unpinned_note("qwen/model", "master", [])


@pytest.mark.parametrize("repository", ["model", "a/b/c", "/model", "qwen/"])
def test_a_repository_id_is_owner_slash_name(repository):
    with pytest.raises(AccessDenied, match="a ModelScope repository id is 'owner/name'"):
        ms._check_arguments(repository, WHERE, "https://hub.example", 3000)


def test_resolution_needs_an_endpoint_and_a_positive_listing_limit():
    with pytest.raises(ValueError, match="endpoint is required"):
        ms.resolve("qwen/model", endpoint="")
    with pytest.raises(ValueError, match="listing_limit must be positive"):
        ms.resolve("qwen/model", endpoint="https://hub.example", listing_limit=0)
