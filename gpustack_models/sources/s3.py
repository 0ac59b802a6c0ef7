"""Resolve an S3 prefix (any S3-compatible store) to its objects, pinned, and their sha256.

Every object under ``prefix/`` (a directory: keys ending in ``/`` are folder markers and left out) is a
file named by the rest of its key. Each is pinned at resolution by its ``VersionId`` where the bucket keeps
versions, and in any case by its ``ETag`` (``Location``); the listing of both is the resolution's "commit".
A file's sha256 comes from the store when it has one for the whole object (``x-amz-checksum-sha256`` of a
single-part upload, or the user metadata ``sha256``), else the worker reads the object once and computes it:
nodes then verify every byte against it, so an object rewritten after resolution (in a bucket without
versions) fails verification on a node and is never published.

Nodes never see the store's keys: a fetch ticket carries, per file, a pre-signed GET of that object
version (``s3_links.presign``), valid for a bounded time. boto3 signs (SigV4) and lists; the endpoint, region,
credentials, proxy and CA bundle are passed explicitly, never read from the environment or ``~/.aws``.
No Django and no Kubernetes here.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator

import boto3
import botocore.exceptions
from botocore import UNSIGNED
from botocore.config import Config

from gpustack_models.sources.hub_errors import (
    AccessDenied,
    InvalidManifest,
    RevisionNotFound,
    SourceUnavailable,
    retry_after_seconds,
)
from gpustack_models.sources.manifest import InvalidPath, ManifestFile, ResolvedRevision
from gpustack_models.sources.s3_links import Keys, Location

_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "403", "401"}
_MISSING_BUCKET = {"NoSuchBucket"}
_MISSING_KEY = {"NoSuchKey", "NoSuchVersion", "404"}
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed"}
_HEX64 = re.compile(r"[0-9a-f]{64}")
READ_CHUNK = 1024 * 1024


def client(endpoint: str, region: str, keys: Keys | None, *, proxy=None, ca_bundle=None, timeout=30.0):
    """A boto3 S3 client for exactly these settings (path-style addressing, SigV4, few retries)."""
    config = Config(
        signature_version=UNSIGNED if keys is None else "s3v4",
        s3={"addressing_style": "path"},
        proxies={"http": proxy, "https": proxy} if proxy else {},
        connect_timeout=timeout,
        read_timeout=timeout,
        retries={"max_attempts": 2, "mode": "standard"},
    )
    session = boto3.session.Session(
        aws_access_key_id=keys.access_key_id if keys else None,
        aws_secret_access_key=keys.secret_access_key if keys else None,
        region_name=region,
    )
    return session.client("s3", endpoint_url=endpoint, config=config, verify=ca_bundle or True)


def directory(prefix: str | None) -> str:
    """``prefix`` as a directory of keys: ``""`` or ends with ``/``."""
    prefix = (prefix or "").strip("/")
    return f"{prefix}/" if prefix else ""


def _failure(exc: Exception, where: str):
    """The resolution failure of a boto3 error: 429, 5xx and no answer may pass; another 4xx (a wrong
    region, an invalid name, a refused key) needs a person."""
    if isinstance(exc, botocore.exceptions.ParamValidationError):
        return AccessDenied(f"{where}: the store cannot be asked this: {exc}")
    if not isinstance(exc, botocore.exceptions.ClientError):
        return SourceUnavailable(f"{where}: the store did not answer: {type(exc).__name__}")
    meta = exc.response.get("ResponseMetadata") or {}
    status = int(meta.get("HTTPStatusCode") or 0)
    code = str((exc.response.get("Error") or {}).get("Code") or status)
    if code in _MISSING_BUCKET:
        return AccessDenied(f"{where}: the bucket does not exist ({code})")
    if code in _MISSING_KEY:
        return RevisionNotFound(f"{where}: the object is gone ({code})")
    if code in _DENIED or (400 <= status < 500 and status != 429 and code not in _THROTTLED):
        return AccessDenied(f"{where}: the store refused the request ({code})")
    retry_after = retry_after_seconds((meta.get("HTTPHeaders") or {}).get("retry-after"))
    return SourceUnavailable(f"{where}: the store answered {code}", retry_after=retry_after)


def _listed(s3, bucket: str, prefix: str) -> Iterator[dict]:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        yield from page.get("Contents") or []


def _stored_sha256(head: dict) -> str | None:
    """The sha256 the store keeps for the whole object, in hex; None when it keeps none (or a composite one)."""
    stored = head.get("ChecksumSHA256") or ""
    if stored and "-" not in stored and head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
        try:
            raw = base64.b64decode(stored, validate=True)
        except ValueError:
            raw = b""
        if len(raw) == 32:
            return raw.hex()
    meta = str((head.get("Metadata") or {}).get("sha256") or "").lower()
    return meta if _HEX64.fullmatch(meta) else None


def _computed_sha256(s3, bucket: str, location: Location) -> str:
    """Read the object version once and hash it."""
    extra = {"VersionId": location.version_id} if location.version_id else {"IfMatch": location.etag}
    body = s3.get_object(Bucket=bucket, Key=location.key, **extra)["Body"]
    digest = hashlib.sha256()
    try:
        for chunk in iter(lambda: body.read(READ_CHUNK), b""):
            digest.update(chunk)
    finally:
        body.close()
    return digest.hexdigest()


def _file(s3, bucket: str, prefix: str, item: dict) -> tuple[ManifestFile, Location]:
    key = item["Key"]
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    location = Location(key, str(head.get("ETag") or item.get("ETag") or ""), head.get("VersionId") or None)
    if location.version_id == "null":
        location = Location(key, location.etag)
    sha256 = _stored_sha256(head) or _computed_sha256(s3, bucket, location)
    try:
        return ManifestFile(key[len(prefix) :], int(head["ContentLength"]), "sha256", sha256), location
    except (InvalidPath, KeyError, TypeError, ValueError) as exc:
        raise InvalidManifest(f"object {key!r} cannot be a file of the model: {exc}") from None


def listing_digest(locations: dict[str, Location]) -> str:
    """The resolution's "commit": sha256 of every key with its version and ETag, sorted."""
    lines = sorted(f"{loc.key}\t{loc.version_id or ''}\t{loc.etag}\n" for loc in locations.values())
    return "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()


def resolve(endpoint: str, bucket: str, prefix: str | None, region: str, keys: Keys | None, **connection):
    """``(resolution, locations)``: every object under the prefix as a file (``ResolvedRevision``, its
    commit the listing's digest) and, by file path, where its bytes are (``Location``)."""
    where = f"s3://{bucket}/{directory(prefix)}"
    s3 = client(endpoint, region, keys, **connection)
    files, locations = [], {}
    try:
        for item in _listed(s3, bucket, directory(prefix)):
            if item["Key"].endswith("/"):
                continue  # a folder marker
            file, location = _file(s3, bucket, directory(prefix), item)
            files.append(file)
            locations[file.path] = location
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise _failure(exc, where) from None
    if not files:
        raise RevisionNotFound(f"{where}: no object under the prefix")
    return ResolvedRevision(listing_digest(locations), files), locations
