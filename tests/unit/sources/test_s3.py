"""The S3 source without a store: a prefix as a directory, the sha256 a store keeps for a whole object (and
the ones it does not), the listing's digest, what the store's errors mean, keys that never show their secret,
and a resolution over a fake client (folder markers left out, each object pinned, a sha256 computed once)."""

from __future__ import annotations

import base64
import hashlib
import io

import botocore.exceptions
import pytest

from gpustack_models.sources import s3
from gpustack_models.sources.hub_errors import AccessDenied, InvalidManifest, RevisionNotFound, SourceUnavailable
from gpustack_models.sources.s3_links import Keys, Location

WEIGHTS = b"weights"
SHA = hashlib.sha256(WEIGHTS).hexdigest()
STORED = base64.b64encode(hashlib.sha256(WEIGHTS).digest()).decode()
WHERE = "s3://bucket/models/"


# ---------------------------------------------------------------- the prefix


@pytest.mark.parametrize(
    ("prefix", "directory"),
    [
        (None, ""),
        ("", ""),
        ("/", ""),
        ("//", ""),
        ("models", "models/"),
        ("models/", "models/"),
        ("/models", "models/"),
        ("org/model/v1", "org/model/v1/"),
        ("/org/model/v1//", "org/model/v1/"),
    ],
)
def test_a_prefix_is_a_directory_of_keys(prefix, directory):
    assert s3.directory(prefix) == directory


# ---------------------------------------------------------------- the stored sha256


@pytest.mark.parametrize(
    "head",
    [
        {"ChecksumSHA256": STORED, "ChecksumType": "FULL_OBJECT"},
        {"ChecksumSHA256": STORED},  # stores that do not say: a single-part upload's
        {"ChecksumSHA256": STORED, "Metadata": {"sha256": "f" * 64}},  # the store's own wins
    ],
)
def test_a_full_object_checksum_is_the_files_sha256_in_hex(head):
    assert s3._stored_sha256(head) == SHA


@pytest.mark.parametrize(
    "head",
    [
        {"ChecksumSHA256": f"{STORED[:-1]}-3"},  # a multipart upload's checksum of its parts' checksums
        {"ChecksumSHA256": "abcd-3", "ChecksumType": "FULL_OBJECT"},
        {"ChecksumSHA256": STORED, "ChecksumType": "COMPOSITE"},
        {},
        {"ChecksumSHA256": None, "Metadata": None},
    ],
)
def test_a_composite_or_absent_checksum_is_no_sha256(head):
    assert s3._stored_sha256(head) is None


@pytest.mark.parametrize(
    ("meta", "sha256"),
    [
        (SHA, SHA),
        (SHA.upper(), SHA),
        (f"sha256:{SHA}", None),
        (SHA[:-1], None),
        (SHA + "0", None),
        ("z" * 64, None),
        (STORED, None),  # base64, not hex
        ("", None),
    ],
)
def test_the_metadata_sha256_counts_only_as_64_hex(meta, sha256):
    assert s3._stored_sha256({"Metadata": {"sha256": meta}}) == sha256
    assert s3._stored_sha256({"ChecksumSHA256": "abc-2", "Metadata": {"sha256": meta}}) == sha256


@pytest.mark.parametrize(
    "stored",
    [
        "not base64!",
        STORED[:-2],  # cut: wrong padding
        base64.b64encode(hashlib.md5(WEIGHTS).digest()).decode(),  # 16 bytes, not 32
        base64.b64encode(hashlib.sha512(WEIGHTS).digest()).decode(),
        STORED.replace("=", "") + "@",
    ],
)
def test_a_malformed_checksum_is_no_sha256(stored):
    assert s3._stored_sha256({"ChecksumSHA256": stored}) is None


# ---------------------------------------------------------------- the listing's digest

LISTING = {
    "config.json": Location("models/config.json", '"e1"', "v1"),
    "model.safetensors": Location("models/model.safetensors", '"e2"'),
}


def test_the_listing_digest_is_a_sha256_digest_independent_of_order():
    digest = s3.listing_digest(LISTING)
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64
    assert s3.listing_digest(dict(reversed(LISTING.items()))) == digest


@pytest.mark.parametrize(
    "changed",
    [
        Location("models/config.json", '"e1"', "v2"),  # another version
        Location("models/config.json", '"e1"'),  # no version
        Location("models/config.json", '"e3"', "v1"),  # another ETag
        Location("models/other.json", '"e1"', "v1"),  # another key
    ],
)
def test_the_listing_digest_changes_with_any_version_etag_or_key(changed):
    assert s3.listing_digest({**LISTING, "config.json": changed}) != s3.listing_digest(LISTING)


# ---------------------------------------------------------------- the store's errors


def client_error(code: str | None, status: int, headers: dict | None = None) -> botocore.exceptions.ClientError:
    error = {"Code": code, "Message": "the store's message"} if code else {}
    metadata = {"HTTPStatusCode": status, "HTTPHeaders": headers or {}}
    return botocore.exceptions.ClientError({"Error": error, "ResponseMetadata": metadata}, "GetObject")


def test_a_missing_bucket_is_access_denied_saying_so():
    failure = s3._failure(client_error("NoSuchBucket", 404), WHERE)
    assert isinstance(failure, AccessDenied) and not failure.retryable
    assert "the bucket does not exist" in failure.message
    assert WHERE in failure.message


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("InvalidAccessKeyId", 403),
        ("SignatureDoesNotMatch", 403),
        ("AccessDenied", 403),
        ("ExpiredToken", 400),
        (None, 403),  # a HEAD's refusal has no body: its status is its code
        (None, 401),
    ],
)
def test_a_refusal_is_access_denied(code, status):
    failure = s3._failure(client_error(code, status), WHERE)
    assert isinstance(failure, AccessDenied)
    assert f"({code or status})" in failure.message


@pytest.mark.parametrize(("code", "status"), [("NoSuchKey", 404), ("NoSuchVersion", 404), (None, 404)])
def test_a_missing_object_is_revision_not_found(code, status):
    assert isinstance(s3._failure(client_error(code, status), WHERE), RevisionNotFound)


@pytest.mark.parametrize(
    ("code", "status", "headers", "retry_after"),
    [
        ("SlowDown", 503, {"retry-after": "7"}, 7),
        (None, 503, {"retry-after": "2"}, 2),
        ("InternalError", 500, {}, None),
        ("ServiceUnavailable", 503, {"retry-after": "soon"}, None),
    ],
)
def test_a_busy_or_failing_store_is_unavailable_with_its_retry_after(code, status, headers, retry_after):
    failure = s3._failure(client_error(code, status, headers), WHERE)
    assert isinstance(failure, SourceUnavailable) and failure.retryable
    assert failure.retry_after == retry_after
    assert f"answered {code or status}" in failure.message


@pytest.mark.parametrize(
    "exc",
    [
        botocore.exceptions.EndpointConnectionError(endpoint_url="https://s3.example"),
        botocore.exceptions.ConnectTimeoutError(endpoint_url="https://s3.example"),
        botocore.exceptions.ReadTimeoutError(endpoint_url="https://s3.example"),
    ],
)
def test_a_store_that_does_not_answer_is_unavailable(exc):
    failure = s3._failure(exc, WHERE)
    assert isinstance(failure, SourceUnavailable) and failure.retryable
    assert type(exc).__name__ in failure.message


def test_keys_never_show_their_secret():
    keys = Keys("AKIAEXAMPLE", "s3cr3t/K7MDENG+bPxRfiCY")
    for text in (repr(keys), str(keys), f"{keys}", repr([keys]), repr({"k": keys})):
        assert "s3cr3t" not in text
        assert "AKIAEXAMPLE" in text
    assert "<redacted>" in repr(keys)


# ---------------------------------------------------------------- a resolution over a fake client


class FakeStore:
    """What ``resolve`` asks of a boto3 client: a paginated listing, a HEAD and a GET per object."""

    def __init__(self, objects: dict[str, tuple[bytes, dict]], fail: Exception | None = None):
        self.objects, self.fail, self.reads = objects, fail, []

    def get_paginator(self, name):
        assert name == "list_objects_v2"
        return self

    def paginate(self, Bucket, Prefix):  # boto3's names
        for key in sorted(k for k in self.objects if k.startswith(Prefix)):
            yield {"Contents": [{"Key": key, "ETag": f'"{key}"'}]}  # one object a page

    def head_object(self, Bucket, Key, ChecksumMode):
        if self.fail is not None:
            raise self.fail
        data, head = self.objects[Key]
        return {"ContentLength": len(data), "ETag": f'"{Key}"', **head}

    def get_object(self, Bucket, Key, **pinned):
        self.reads.append((Key, pinned))
        return {"Body": io.BytesIO(self.objects[Key][0])}


def resolve(monkeypatch, store: FakeStore, prefix="models"):
    monkeypatch.setattr(s3, "client", lambda *args, **kwargs: store)
    return s3.resolve("https://s3.example", "bucket", prefix, "us-east-1", None)


def test_it_resolves_every_object_under_the_prefix_pinned_with_its_sha256(monkeypatch):
    store = FakeStore(
        {
            "models/": (b"", {}),  # a folder marker
            "models/config.json": (b"{}", {"VersionId": "v1"}),
            "models/sub/model.safetensors": (WEIGHTS, {"ChecksumSHA256": STORED, "VersionId": "null"}),
            "other/file": (b"x", {}),
        }
    )
    resolution, locations = resolve(monkeypatch, store)
    assert [(f.path, f.size, f.algorithm, f.hexdigest) for f in resolution.files] == [
        ("config.json", 2, "sha256", hashlib.sha256(b"{}").hexdigest()),
        ("sub/model.safetensors", len(WEIGHTS), "sha256", SHA),
    ]
    assert locations == {
        "config.json": Location("models/config.json", '"models/config.json"', "v1"),
        "sub/model.safetensors": Location("models/sub/model.safetensors", '"models/sub/model.safetensors"'),
    }  # "null": the bucket keeps no versions
    assert resolution.commit == s3.listing_digest(locations)
    assert store.reads == [("models/config.json", {"VersionId": "v1"})]  # read once: the store kept no sha256


def test_an_object_without_a_version_is_read_at_its_etag(monkeypatch):
    store = FakeStore({"models/a.bin": (WEIGHTS, {})})
    resolve(monkeypatch, store)
    assert store.reads == [("models/a.bin", {"IfMatch": '"models/a.bin"'})]


def test_a_prefix_without_objects_is_revision_not_found(monkeypatch):
    with pytest.raises(RevisionNotFound, match="no object under the prefix"):
        resolve(monkeypatch, FakeStore({"models/": (b"", {}), "other/a": (b"x", {})}))


def test_a_store_error_during_the_listing_is_its_failure(monkeypatch):
    store = FakeStore({"models/a.bin": (WEIGHTS, {})}, fail=client_error("AccessDenied", 403))
    with pytest.raises(AccessDenied, match="s3://bucket/models/"):
        resolve(monkeypatch, store)


def test_an_object_that_cannot_be_a_file_is_an_invalid_manifest(monkeypatch):
    with pytest.raises(InvalidManifest, match="cannot be a file"):
        resolve(monkeypatch, FakeStore({"models//a.bin": (WEIGHTS, {})}))
