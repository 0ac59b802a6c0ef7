"""The suite's S3 server (``tests/support/s3server.py``) is a real one: versitygw checks SigV4 signatures in
headers and presigned URLs, lists a prefix with a '/' in it (moto's server refuses that signature), keeps the
versions of a key, validates and returns SHA-256 checksums, and answers ranged GETs with 206."""

from __future__ import annotations

import base64
import hashlib
import urllib.parse
import uuid

import pytest
import requests
from botocore.exceptions import ClientError

DATA = b"weights of a tiny model\n" * 64


def b64sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


@pytest.fixture
def bucket(s3):
    """A bucket of this test's own."""
    return s3.create_bucket(f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def versioned(s3):
    """A versioned bucket of this test's own."""
    return s3.create_bucket(f"v-{uuid.uuid4().hex[:12]}", versioned=True)


def refusal(call, *args, **kwargs) -> tuple[str, int]:
    """The error code and HTTP status of a call that must fail."""
    with pytest.raises(ClientError) as refused:
        call(*args, **kwargs)
    response = refused.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def _plain() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


def test_a_wrong_secret_key_is_refused(s3, bucket):
    s3.put(bucket, "m/a", DATA)
    wrong = s3.client(secret_key=s3.secret_key[::-1])
    assert refusal(wrong.get_object, Bucket=bucket, Key="m/a") == ("SignatureDoesNotMatch", 403)
    assert s3.client().get_object(Bucket=bucket, Key="m/a")["Body"].read() == DATA  # the right one is not


def test_an_unknown_access_key_is_refused(s3, bucket):
    s3.put(bucket, "m/a", DATA)
    stranger = s3.client(access_key="AKIANOBODYHERE000000", secret_key=s3.secret_key)
    assert refusal(stranger.get_object, Bucket=bucket, Key="m/a") == ("InvalidAccessKeyId", 403)
    assert refusal(stranger.list_buckets) == ("InvalidAccessKeyId", 403)


def test_a_listing_by_prefix_lists_exactly_the_keys_under_it(s3, bucket):
    for key in ("m/a", "m/b/c", "mx", "n/a", "m-y/z"):
        s3.put(bucket, key, DATA)
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix="m/")
    assert [o["Key"] for o in listed["Contents"]] == ["m/a", "m/b/c"]
    assert listed["KeyCount"] == 2 and not listed["IsTruncated"]
    level = s3.client().list_objects_v2(Bucket=bucket, Prefix="m/", Delimiter="/")
    assert [o["Key"] for o in level["Contents"]] == ["m/a"]
    assert level["CommonPrefixes"] == [{"Prefix": "m/b/"}]


def test_a_versioned_bucket_keeps_every_version_of_a_key(s3, versioned):
    first = s3.put(versioned, "m/model.bin", b"old bytes")
    second = s3.put(versioned, "m/model.bin", b"new bytes, longer")
    assert first["VersionId"] and second["VersionId"] and first["VersionId"] != second["VersionId"]
    client = s3.client()
    versions = client.list_object_versions(Bucket=versioned, Prefix="m/model.bin")["Versions"]
    latest = {v["VersionId"]: v["IsLatest"] for v in versions}
    assert latest == {first["VersionId"]: False, second["VersionId"]: True}
    old = client.get_object(Bucket=versioned, Key="m/model.bin", VersionId=first["VersionId"])
    assert old["Body"].read() == b"old bytes"
    assert old["VersionId"] == first["VersionId"]
    assert client.get_object(Bucket=versioned, Key="m/model.bin")["Body"].read() == b"new bytes, longer"
    head = client.head_object(Bucket=versioned, Key="m/model.bin")
    assert head["VersionId"] == second["VersionId"]
    assert head["ETag"] == second["ETag"] == f'"{hashlib.md5(b"new bytes, longer").hexdigest()}"'
    assert head["ContentLength"] == len(b"new bytes, longer")


def test_head_object_returns_the_sha256_an_object_was_put_with(s3, bucket):
    put = s3.put(bucket, "m/model.bin", DATA, checksum=True)
    assert put["ChecksumSHA256"] == b64sha256(DATA)
    head = s3.client().head_object(Bucket=bucket, Key="m/model.bin", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == b64sha256(DATA)
    assert head["ChecksumType"] == "FULL_OBJECT"


def test_a_put_with_a_wrong_sha256_is_refused_and_stores_nothing(s3, bucket):
    client = s3.client()
    wrong = b64sha256(DATA + b"!")
    code, status = refusal(client.put_object, Bucket=bucket, Key="m/bad", Body=DATA, ChecksumSHA256=wrong)
    assert (code, status) == ("BadDigest", 400)
    assert refusal(client.head_object, Bucket=bucket, Key="m/bad") == ("404", 404)


def test_a_ranged_get_answers_206_with_those_bytes(s3, bucket):
    s3.put(bucket, "m/model.bin", DATA)
    got = s3.client().get_object(Bucket=bucket, Key="m/model.bin", Range="bytes=0-3")
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["Body"].read() == DATA[:4]
    assert got["ContentRange"] == f"bytes 0-3/{len(DATA)}"
    assert got["ContentLength"] == 4


def tampered(url: str) -> str:
    """``url`` with the first character of its ``X-Amz-Signature`` changed."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    signed = dict(query)["X-Amz-Signature"]
    changed = ("0" if signed[0] != "0" else "1") + signed[1:]
    query = [(k, changed if k == "X-Amz-Signature" else v) for k, v in query]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def test_a_presigned_url_of_a_version_serves_it_and_a_tampered_one_is_refused(s3, versioned):
    first = s3.put(versioned, "m/model.bin", b"old bytes")
    s3.put(versioned, "m/model.bin", b"new bytes")
    params = {"Bucket": versioned, "Key": "m/model.bin", "VersionId": first["VersionId"]}
    url = s3.client().generate_presigned_url("get_object", Params=params, ExpiresIn=60)
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["versionId"] == [first["VersionId"]]
    response = _plain().get(url, timeout=30)
    assert response.status_code == 200
    assert response.content == b"old bytes"
    assert response.headers["x-amz-version-id"] == first["VersionId"]
    forged = _plain().get(tampered(url), timeout=30)
    assert forged.status_code == 403
    assert "<Code>SignatureDoesNotMatch</Code>" in forged.text
    assert b"bytes" not in forged.content


def test_a_missing_bucket_is_no_such_bucket(s3):
    client = s3.client()
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    assert refusal(client.list_objects_v2, Bucket=missing) == ("NoSuchBucket", 404)
    assert refusal(client.get_object, Bucket=missing, Key="m/a") == ("NoSuchBucket", 404)
