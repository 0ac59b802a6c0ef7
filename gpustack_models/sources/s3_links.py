"""Pre-signed GETs of S3 objects, for fetch tickets: what a node may read, and for how long.

Signed with botocore's SigV4 query signer alone (no service model, no client: the API process, which
answers tickets, loads a few MB rather than boto3's), for path-style addresses
``<endpoint>/<bucket>/<key>[?versionId=…]``. Without keys (a public bucket) the URL is unsigned.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlencode

from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


@dataclass(frozen=True, repr=False)
class Keys:
    """An access key id and its secret (from the artifact's Secret); never in a repr."""

    access_key_id: str
    secret_access_key: str

    def __repr__(self) -> str:
        return f"Keys(access_key_id={self.access_key_id!r}, secret_access_key=<redacted>)"


@dataclass(frozen=True)
class Location:
    """Where a file's bytes are: its key, and the version and ETag it had at resolution."""

    key: str
    etag: str
    version_id: str | None = None

    def to_dict(self) -> dict:
        return {"key": self.key, "etag": self.etag, **({"versionId": self.version_id} if self.version_id else {})}

    @classmethod
    def from_dict(cls, data: dict) -> Location:
        return cls(data["key"], data.get("etag", ""), data.get("versionId") or None)


def object_url(endpoint: str, bucket: str, location: Location) -> str:
    """The path-style URL of an object version."""
    url = f"{endpoint.rstrip('/')}/{bucket}/{quote(location.key, safe='/~')}"
    return f"{url}?{urlencode({'versionId': location.version_id})}" if location.version_id else url


def presign(endpoint: str, region: str, keys: Keys | None, bucket: str, location: Location, seconds: int) -> str:
    """A GET of exactly this object version, valid ``seconds`` (unsigned without ``keys``)."""
    url = object_url(endpoint, bucket, location)
    if keys is None:
        return url
    request = AWSRequest(method="GET", url=url)
    credentials = Credentials(keys.access_key_id, keys.secret_access_key)
    S3SigV4QueryAuth(credentials, "s3", region, expires=seconds).add_auth(request)
    return request.url
