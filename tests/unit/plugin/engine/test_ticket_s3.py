"""A fetch ticket's S3 sources: a bucket, the listing's digest for a commit, no token, and a pre-signed link
per file that must be on the endpoint's origin; a file's URL is its link; a ticket needs a link for every
file; the links travel in the wire form, count in a source's identity and never show in a repr."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from gpustack_models.plugin.engine.failures import INVALID_REQUEST, DownloadFailed
from gpustack_models.plugin.engine.ticket import HUGGING_FACE, S3, FetchTicket, HubSource
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

ENDPOINT = "https://s3.example"
COMMIT = "sha256:" + hashlib.sha256(b"the listing").hexdigest()
SIGNATURE = "5e" * 32
WEIGHTS = b"weights"
FILES = (
    ManifestFile("config.json", 2, "sha256", hashlib.sha256(b"{}").hexdigest()),
    ManifestFile("sub/model a.bin", len(WEIGHTS), "sha256", hashlib.sha256(WEIGHTS).hexdigest()),
)


def link(path: str, base: str = ENDPOINT) -> str:
    return f"{base}/bucket/models/{path.replace(' ', '%20')}?versionId=v1&X-Amz-Signature={SIGNATURE}"


LINKS = {f.path: link(f.path) for f in FILES}


def hub(**changes) -> HubSource:
    return dataclasses.replace(HubSource(S3, ENDPOINT + "/", "bucket", COMMIT, links=LINKS), **changes)


def ticket(fallbacks=None, files=FILES) -> FetchTicket:
    """A ticket of a public hub's files, the S3 source(s) its fallbacks (``hub()`` unless given)."""
    first = FetchTicket(manifest_digest(files), HUGGING_FACE, "https://hub.example", "org/model", "c0ffee", files)
    return dataclasses.replace(first, fallbacks=(hub(),) if fallbacks is None else fallbacks)


def refusal(source: HubSource) -> str:
    with pytest.raises(DownloadFailed) as caught:
        source.check()
    assert caught.value.reason == INVALID_REQUEST
    return caught.value.message


# ---------------------------------------------------------------- check


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"links": {}},  # a source alone may have none: the ticket wants one per file
        {"repository": "my.bucket-2"},
        {"links": {"a": link("a", "https://S3.Example")}},  # the host in any case
        {"links": {"a": link("a", "https://s3.example:443")}},  # the default port spelt out
        {"endpoint": "http://127.0.0.1:9000", "links": {"a": link("a", "http://127.0.0.1:9000")}},
        {"endpoint": "https://s3.example/store", "links": {"a": link("a")}},  # the origin, not the path
    ],
)
def test_an_s3_source_with_a_bucket_a_listing_digest_and_links_on_its_origin_passes(changes):
    hub(**changes).check()


@pytest.mark.parametrize("bucket", ["Bucket", "ab", "a_b", "-bucket", "bucket-", "a" * 64, "org/bucket", "", None])
def test_a_repository_that_is_not_a_bucket_name_fails(bucket):
    assert "not a bucket name" in refusal(hub(repository=bucket))


@pytest.mark.parametrize("commit", ["c" * 40, "v1", COMMIT.upper(), COMMIT[:-1], COMMIT.removeprefix("sha256:"), None])
def test_a_commit_that_is_not_the_listings_digest_fails(commit):
    assert "digest of its listing" in refusal(hub(commit=commit))


@pytest.mark.parametrize("token", ["AKIAEXAMPLE", "", "cm9ib3Q6cHc="])
def test_an_s3_source_carries_no_token(token):
    assert "carries no token" in refusal(hub(token=token))


@pytest.mark.parametrize(
    "bad",
    [
        link("a", "https://other.example"),  # another host
        link("a", "https://s3.example.evil"),
        link("a", "https://s3.example:8443"),  # another port
        link("a", "http://s3.example"),  # another scheme (and port)
        link("a", "https://user:pw@s3.example"),  # user info
        link("a", "https://user@s3.example"),
    ],
)
def test_a_link_off_the_endpoints_origin_fails(bad):
    assert "on its endpoint's origin" in refusal(hub(links={"a": bad}))


@pytest.mark.parametrize("bad", ["ftp://s3.example/bucket/a", "file:///etc/passwd", "/bucket/a", "", 7, None])
def test_a_link_that_is_not_an_http_url_fails(bad):
    assert "must be http(s) URLs" in refusal(hub(links={"a": bad}))


def test_a_link_with_a_password_alone_in_its_user_info_fails():
    assert "on its endpoint's origin" in refusal(hub(links={"a": link("a", "https://:pw@s3.example")}))


@pytest.mark.parametrize(
    "changes",
    [
        {"links": {"a": link("a", "https://s3.example:99999")}},
        {"links": {"a": link("a", "https://s3.example:x")}},
        {"endpoint": "https://s3.example:99999", "links": {}},
    ],
)
def test_a_malformed_port_fails_as_an_invalid_ticket(changes):
    refusal(hub(**changes))


# ---------------------------------------------------------------- the files' URLs


def test_a_files_url_is_its_link_and_no_header_goes_with_it():
    assert [hub().url(f) for f in FILES] == [LINKS["config.json"], LINKS["sub/model a.bin"]]
    assert hub().hub_headers() == {}


def test_links_are_kept_by_path_whatever_their_order():
    assert hub(links=dict(reversed(LINKS.items()))) == hub()
    assert hub().links == tuple(sorted(LINKS.items()))


# ---------------------------------------------------------------- tickets


def test_a_ticket_with_an_s3_fallback_linking_every_file_validates():
    assert ticket().validate().sources[1] == hub()


def test_an_s3_source_without_a_link_for_a_file_fails_the_ticket():
    for links in ({"config.json": LINKS["config.json"]}, {}, {"other.bin": link("other.bin")}):
        with pytest.raises(DownloadFailed, match="no link") as caught:
            ticket(fallbacks=(hub(links=links),)).validate()
        assert caught.value.reason == INVALID_REQUEST


def test_extra_links_do_not_fail_the_ticket():
    ticket(fallbacks=(hub(links={**LINKS, "other.bin": link("other.bin")}),)).validate()


def test_s3_files_must_be_identified_by_sha256():
    blob = ManifestFile("config.json", 2, "gitsha1", hashlib.sha1(b"blob 2\0{}").hexdigest())
    with pytest.raises(DownloadFailed, match="S3 files are identified by sha256"):
        ticket(files=(blob, FILES[1])).validate()


def test_a_bad_link_of_a_fallback_fails_the_ticket():
    links = {**LINKS, "config.json": link("config.json", "https://other.example")}
    with pytest.raises(DownloadFailed, match="endpoint's origin"):
        ticket(fallbacks=(hub(links=links),)).validate()


def test_a_ticket_whose_first_source_is_s3_validates_and_fetches_by_its_links():
    first = hub().to_dict()
    answer = {"digest": manifest_digest(FILES), **first, "files": [wire(f) for f in FILES], "sources": [first]}
    received = FetchTicket.from_dict(answer).validate()
    assert received.url(FILES[1]) == LINKS["sub/model a.bin"]


def wire(f: ManifestFile) -> dict:
    return {"path": f.path, "size": f.size, "algorithm": f.algorithm, "hexdigest": f.hexdigest}


# ---------------------------------------------------------------- wire form, identity, secrecy


def test_the_links_travel_in_the_wire_form():
    assert hub().to_dict()["links"] == LINKS
    assert HubSource.from_dict(hub().to_dict()) == hub()
    assert "links" not in HubSource(S3, ENDPOINT, "bucket", COMMIT).to_dict()
    again = FetchTicket.from_dict(ticket().to_dict())
    assert again.fallbacks == (hub(),)
    assert again.to_dict()["sources"][1]["links"] == LINKS


def test_two_s3_sources_differing_only_in_their_links_are_two_sources():
    relinked = hub(links={path: url.replace(SIGNATURE, "7f" * 32) for path, url in LINKS.items()})
    assert relinked.key != hub().key
    assert hub(links=dict(reversed(LINKS.items()))).key == hub().key
    assert SIGNATURE not in repr(hub().key)
    assert len(ticket(fallbacks=(hub(), relinked, hub())).sources) == 3


def test_a_links_signature_never_shows_in_a_repr():
    for text in (repr(hub()), str(hub()), repr(ticket()), str(ticket())):
        assert SIGNATURE not in text
        assert "X-Amz-Signature" not in text
