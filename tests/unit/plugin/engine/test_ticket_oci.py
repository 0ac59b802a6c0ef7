"""A fetch ticket's registry sources: what ``check`` takes for a repository and a commit, a file's blob URL by
its sha256, a credential that is never a header as it is, and files that must be identified by sha256."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from gpustack_models.plugin.engine.failures import INVALID_REQUEST, DownloadFailed
from gpustack_models.plugin.engine.ticket import HUGGING_FACE, OCI, FetchTicket, HubSource
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

COMMIT = "sha256:" + hashlib.sha256(b"the manifest").hexdigest()
TOKEN = "cm9ib3Q6czNjcjN0LXB3"  # base64("robot:s3cr3t-pw")
WEIGHTS = b"weights"
FILES = (
    ManifestFile("config.json", 2, "sha256", hashlib.sha256(b"{}").hexdigest()),
    ManifestFile("model.safetensors", len(WEIGHTS), "sha256", hashlib.sha256(WEIGHTS).hexdigest()),
)


def hub(**changes) -> HubSource:
    base = HubSource(OCI, "https://registry.example:5000/", "team/model", COMMIT, TOKEN)
    return dataclasses.replace(base, **changes)


def ticket(files=FILES, **changes) -> FetchTicket:
    base = FetchTicket(manifest_digest(files), OCI, "https://registry.example:5000", "team/model", COMMIT, files)
    return dataclasses.replace(base, token=TOKEN, **changes)


def refusal(source: HubSource) -> str:
    with pytest.raises(DownloadFailed) as caught:
        source.check()
    assert caught.value.reason == INVALID_REQUEST
    return caught.value.message


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"token": None},
        {"repository": "model"},
        {"repository": "a/b/c/d-e__f.g"},
        {"endpoint": "http://localhost:5000"},
        {"endpoint": "https://registry-1.docker.io", "repository": "library/nginx"},
    ],
)
def test_a_registry_source_with_a_repository_and_a_manifest_digest_passes(changes):
    hub(**changes).check()


@pytest.mark.parametrize(
    "commit",
    [
        "v1",  # a tag: the commit is what the tag was pinned to
        "latest",
        COMMIT.upper(),
        COMMIT[:-1],
        COMMIT + "0",
        COMMIT.removeprefix("sha256:"),
        "sha512:" + "a" * 128,
        None,
    ],
)
def test_a_commit_that_is_not_a_sha256_digest_fails(commit):
    assert "manifest's sha256 digest" in refusal(hub(commit=commit))


@pytest.mark.parametrize(
    "repository",
    [
        "Team/Model",
        "team/Model",
        "team/../model",
        "../model",
        "team/..",
        "team//model",
        "/team/model",
        "team/model/",
        "",
        None,
        "a" * 256,
    ],
)
def test_a_repository_that_is_not_a_registry_path_fails(repository):
    assert "registry repository path" in refusal(hub(repository=repository))


def test_a_repository_hubs_allow_but_registries_do_not_fails_for_a_registry():
    HubSource(HUGGING_FACE, "https://hub.example", "Org/Model", "c0ffee").check()
    assert "registry repository path" in refusal(hub(repository="Org/Model"))


@pytest.mark.parametrize("token", ["", "with space", "new\nline", "x" * 4097])
def test_a_malformed_token_fails(token):
    assert "token must be" in refusal(hub(token=token))


@pytest.mark.parametrize("endpoint", ["ftp://registry.example", "registry.example", "https://u:p@registry.example"])
def test_an_endpoint_that_is_not_a_bare_http_url_fails(endpoint):
    assert "endpoint" in refusal(hub(endpoint=endpoint))


def test_a_files_url_is_its_blob_by_sha256():
    weights = FILES[1]
    assert hub().url(weights) == f"https://registry.example:5000/v2/team/model/blobs/sha256:{weights.hexdigest}"
    assert ticket().url(weights) == hub().url(weights)


def test_the_url_ignores_the_files_path():
    moved = ManifestFile("dir/a b#.bin", len(WEIGHTS), "sha256", FILES[1].hexdigest)
    assert hub().url(moved) == hub().url(FILES[1])


def test_the_credential_is_never_a_header_as_it_is():
    assert hub().hub_headers() == {}
    assert hub(token=None).hub_headers() == {}
    assert ticket().hub_headers() == {}
    hf = HubSource(HUGGING_FACE, "https://hub.example", "org/model", "c0ffee", TOKEN)
    assert hf.hub_headers() == {"Authorization": f"Bearer {TOKEN}"}  # hubs do send theirs


def test_a_ticket_of_registry_files_validates():
    assert ticket().validate().sources == (hub(),)


def test_registry_files_must_be_identified_by_sha256():
    blob = ManifestFile("config.json", 2, "gitsha1", hashlib.sha1(b"blob 2\0{}").hexdigest())
    files = (blob, FILES[1])
    with pytest.raises(DownloadFailed) as caught:
        ticket(files=files).validate()
    assert caught.value.reason == INVALID_REQUEST
    assert "registry files are identified by sha256" in caught.value.message


def test_a_registry_fallback_also_requires_sha256_files():
    blob = ManifestFile("config.json", 2, "gitsha1", hashlib.sha1(b"blob 2\0{}").hexdigest())
    files = (blob, FILES[1])
    first = FetchTicket(manifest_digest(files), HUGGING_FACE, "https://hub.example", "org/model", "c0ffee", files)
    with pytest.raises(DownloadFailed, match="identified by sha256"):
        dataclasses.replace(first, fallbacks=(hub(),)).validate()


def test_a_fallbacks_bad_commit_fails_the_ticket():
    with pytest.raises(DownloadFailed, match="manifest's sha256 digest"):
        ticket(fallbacks=(hub(commit="v1"),)).validate()


def test_the_token_is_redacted_everywhere_it_could_show():
    texts = [repr(hub()), str(hub()), repr(ticket()), str(ticket(fallbacks=(hub(repository="other/model"),)))]
    texts.append(repr(ticket().to_dict()))
    for text in texts:
        assert TOKEN not in text
        assert "s3cr3t" not in text
    assert "token=<redacted>" in repr(hub())
    assert "token=None" in repr(hub(token=None))


def test_the_token_travels_only_when_asked_for():
    assert "token" not in ticket().to_dict()
    assert ticket().to_dict(include_token=True)["token"] == TOKEN
    again = FetchTicket.from_dict(ticket().to_dict(include_token=True))
    assert again == ticket()
    assert again.validate().primary == hub()


def test_two_registry_sources_differ_by_their_token_without_keeping_it_in_the_key():
    assert hub().key != hub(token="other").key
    assert TOKEN not in repr(hub().key)
    assert len(ticket(fallbacks=(hub(), hub(token="other"))).sources) == 2


LAYER = "sha256:" + "ab" * 32
EXTENTS = {
    "config.json": {"blob": LAYER, "offset": 512, "size": 9000, "encoding": "gzip"},
    "model.safetensors": {"blob": "sha256:" + "cd" * 32, "offset": 1536, "size": 4096},
}


def test_a_file_inside_a_compressed_layer_is_packed_and_one_inside_a_plain_layer_has_an_extent():
    source = hub(extents=EXTENTS)
    source.check()
    config, weights = FILES
    assert source.packed(config) == (LAYER, 512, 9000, "gzip")
    assert source.extent(config) == (0, config.size)  # no byte range of the compressed blob is the file's
    assert source.packed(weights) is None
    assert source.extent(weights) == (1536, 4096)
    assert source.url(config) == f"https://registry.example:5000/v2/team/model/blobs/{LAYER}"


def test_extents_and_their_encoding_travel_in_the_wire_form():
    sent = ticket(extents=EXTENTS).to_dict(include_token=True)
    assert sent["extents"] == EXTENTS  # no encoding written for an uncompressed layer
    again = FetchTicket.from_dict(sent)
    assert again.validate().primary.packed(FILES[0]) == (LAYER, 512, 9000, "gzip")


@pytest.mark.parametrize("encoding", ["brotli", "GZIP", None, 1])
def test_an_encoding_nodes_cannot_read_is_refused(encoding):
    extents = dict(EXTENTS, **{"config.json": dict(EXTENTS["config.json"], encoding=encoding)})
    assert "encoding" in refusal(hub(extents=extents))
