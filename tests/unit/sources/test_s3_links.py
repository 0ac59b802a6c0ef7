"""Pre-signed GETs of S3 objects: a key quoted into a path-style URL, a version kept, a link signed for exactly
``seconds`` with the access key's scope (the signature checked here as a store checks it), and never the
secret in it; locations as the resolution stores them."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime
from urllib.parse import parse_qsl, quote, urlsplit

import botocore.auth
import pytest

from gpustack_models.sources.s3_links import Keys, Location, object_url, presign

ENDPOINT = "http://127.0.0.1:9000"
KEYS = Keys("AKIAEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch):
    """botocore's signing time, fixed: the same request signed twice is the same link."""
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: NOW.replace(tzinfo=None))


def query(url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))


def signature_of(url: str, secret: str, region: str) -> str:
    """The signature a store computes for a pre-signed GET (SigV4, query form, unsigned payload, host only)."""
    parts = urlsplit(url)
    pairs = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "X-Amz-Signature"]
    canonical_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(pairs))
    canonical = f"GET\n{parts.path}\n{canonical_query}\nhost:{parts.netloc}\n\nhost\nUNSIGNED-PAYLOAD"
    stamp = query(url)["X-Amz-Date"]
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = f"AWS4{secret}".encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- object URLs


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("model.safetensors", "model.safetensors"),
        ("org/model/v1/config.json", "org/model/v1/config.json"),
        ("dir/a b.bin", "dir/a%20b.bin"),
        ("modèle/poids.bin", "mod%C3%A8le/poids.bin"),
        ("a+b.bin", "a%2Bb.bin"),
        ("what?.bin", "what%3F.bin"),
        ("part#1.bin", "part%231.bin"),
        ("100%.bin", "100%25.bin"),
        ("a-b_c.d~e", "a-b_c.d~e"),  # unreserved: as it is
        ("x=1&y=2", "x%3D1%26y%3D2"),
    ],
)
def test_an_object_url_is_path_style_with_the_key_quoted_but_its_slashes(key, path):
    assert object_url(ENDPOINT, "bucket", Location(key, '"e"')) == f"{ENDPOINT}/bucket/{path}"


def test_an_object_url_ignores_a_trailing_slash_of_the_endpoint():
    assert object_url(ENDPOINT + "/", "bucket", Location("a", "")) == f"{ENDPOINT}/bucket/a"


def test_an_object_url_names_its_version_when_it_has_one():
    url = object_url(ENDPOINT, "bucket", Location("dir/a b", '"e"', "3/L4kq+tZ=="))
    assert url.startswith(f"{ENDPOINT}/bucket/dir/a%20b?")
    assert query(url) == {"versionId": "3/L4kq+tZ=="}
    assert "?" not in object_url(ENDPOINT, "bucket", Location("dir/a b", '"e"'))


# ---------------------------------------------------------------- pre-signed links


def test_without_keys_a_link_is_the_plain_url():
    location = Location("dir/a b.bin", '"e"', "v1")
    assert presign(ENDPOINT, "us-east-1", None, "bucket", location, 600) == object_url(ENDPOINT, "bucket", location)


@pytest.mark.parametrize("seconds", [60, 3600, 7 * 24 * 3600])
def test_a_link_is_signed_with_the_access_keys_scope_for_exactly_its_seconds(seconds):
    url = presign(ENDPOINT, "eu-west-3", KEYS, "bucket", Location("dir/a b.bin", '"e"'), seconds)
    assert url.startswith(f"{ENDPOINT}/bucket/dir/a%20b.bin?")
    signed = query(url)
    assert signed["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert signed["X-Amz-Credential"] == "AKIAEXAMPLE/20260102/eu-west-3/s3/aws4_request"
    assert signed["X-Amz-Date"] == "20260102T030405Z"
    assert signed["X-Amz-Expires"] == str(seconds)
    assert signed["X-Amz-SignedHeaders"] == "host"
    assert len(signed["X-Amz-Signature"]) == 64
    assert int(signed["X-Amz-Signature"], 16) >= 0


def test_a_link_keeps_the_version():
    url = presign(ENDPOINT, "us-east-1", KEYS, "bucket", Location("a.bin", '"e"', "3/L4kq+tZ=="), 600)
    assert query(url)["versionId"] == "3/L4kq+tZ=="


@pytest.mark.parametrize("key", ["a.bin", "dir/a b.bin", "modèle/poids+1?.bin", "part#1/100%.bin"])
@pytest.mark.parametrize("version", [None, "3/L4kq+tZ=="])
def test_a_links_signature_is_the_one_the_store_computes(key, version):
    url = presign(ENDPOINT, "eu-west-3", KEYS, "bucket", Location(key, '"e"', version), 600)
    assert query(url)["X-Amz-Signature"] == signature_of(url, KEYS.secret_access_key, "eu-west-3")
    assert query(url)["X-Amz-Signature"] != signature_of(url, "another-secret", "eu-west-3")
    assert query(url)["X-Amz-Signature"] != signature_of(url, KEYS.secret_access_key, "us-east-1")


def test_a_link_never_carries_the_secret():
    url = presign(ENDPOINT, "us-east-1", KEYS, "bucket", Location("a.bin", '"e"', "v1"), 600)
    for form in (KEYS.secret_access_key, quote(KEYS.secret_access_key, safe=""), "K7MDENG"):
        assert form not in url


def test_two_secrets_give_two_signatures_and_one_secret_the_same():
    location = Location("a.bin", '"e"', "v1")
    signed = [presign(ENDPOINT, "us-east-1", keys, "bucket", location, 600) for keys in (KEYS, KEYS)]
    other = presign(ENDPOINT, "us-east-1", Keys(KEYS.access_key_id, "another-secret"), "bucket", location, 600)
    assert signed[0] == signed[1]
    assert query(other)["X-Amz-Signature"] != query(signed[0])["X-Amz-Signature"]


# ---------------------------------------------------------------- locations


@pytest.mark.parametrize(
    ("location", "stored"),
    [
        (Location("dir/a b", '"e1"', "v1"), {"key": "dir/a b", "etag": '"e1"', "versionId": "v1"}),
        (Location("a", '"e1"'), {"key": "a", "etag": '"e1"'}),
        (Location("a", ""), {"key": "a", "etag": ""}),
    ],
)
def test_a_location_round_trips_through_its_stored_form(location, stored):
    assert location.to_dict() == stored
    assert Location.from_dict(location.to_dict()) == location


@pytest.mark.parametrize(
    ("stored", "location"),
    [
        ({"key": "a"}, Location("a", "")),
        ({"key": "a", "etag": '"e"', "versionId": None}, Location("a", '"e"')),
        ({"key": "a", "etag": '"e"', "versionId": ""}, Location("a", '"e"')),
    ],
)
def test_a_location_reads_a_stored_form_without_etag_or_version(stored, location):
    assert Location.from_dict(stored) == location
