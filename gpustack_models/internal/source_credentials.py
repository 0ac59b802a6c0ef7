"""What a fetch ticket carries for a registry or an S3 source, read from the tenant's Secret.

- a registry source: the ``.dockerconfigjson`` credentials for that registry, as ``base64(user:password)``,
  the token a plugin answers the registry's challenges with (``plugin.engine.registry_auth``);
- an S3 source: no credential at all. Each file's object, at the version and ETag pinned at resolution, as a
  GET pre-signed with the Secret's keys (SigV4, valid ``GPUSTACK_S3_LINK_SECONDS``): a node can read those
  objects for that long, and nothing else of the store.

Each answers ``None`` / ``{}`` (the source is then offered without, or not at all) when the Secret is gone or
holds nothing usable. The callers apply the rule of who may receive what (``tickets``).
"""

from __future__ import annotations

import base64
import json
import re

from django.conf import settings

from gpustack_models import kube
from gpustack_models.sources import oci, s3_links

# The tokens a plugin's FetchTicket accepts (printable ASCII, no space): any other is not offered.
TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")


def _secret_data(namespace: str, secret_name: str) -> dict:
    try:
        return kube.default().get(f"/api/v1/namespaces/{namespace}/secrets/{secret_name}").get("data") or {}
    except kube.StatusError:
        return {}


def registry_token(namespace: str, secret_name: str, endpoint: str) -> str | None:
    """The credentials a ``.dockerconfigjson`` Secret holds for the registry at ``endpoint``, as the
    ``base64(user:password)`` the plugin answers the registry's challenges with (the registry's and its
    token service's origins only)."""
    raw = _secret_data(namespace, secret_name).get(".dockerconfigjson")
    try:
        config = json.loads(base64.b64decode(raw)) if raw else None
        found = oci.credentials_for(config, oci.registry_of(endpoint)) if config else None
    except (TypeError, ValueError):
        return None
    token = found.basic if found else None
    return token if token and TOKEN.fullmatch(token) else None


def s3_keys(namespace: str, secret_name: str):
    """The access key and secret of an S3 source's Secret (``accessKeyId``/``secretAccessKey``, else the
    ``AWS_*`` names), or ``None``: no Secret named, or none of its pairs usable."""
    data = _secret_data(namespace, secret_name) if secret_name else {}
    for key_id, secret in (("accessKeyId", "secretAccessKey"), ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")):
        try:
            pair = [base64.b64decode(data[name]).decode().strip() for name in (key_id, secret)]
        except (KeyError, TypeError, ValueError):
            continue
        if all(pair) and TOKEN.fullmatch(pair[0]):
            return s3_links.Keys(*pair)
    return None


def object_links(namespace: str, secret_name: str, row) -> dict[str, str]:
    """``{path: pre-signed GET}`` of every file of an S3 resolution; ``{}`` when its Secret is unusable."""
    keys = s3_keys(namespace, secret_name)
    if secret_name and keys is None:
        return {}
    pinned = row.objects_pinned or {}
    region, seconds = pinned.get("region") or "us-east-1", settings.S3_LINK_SECONDS
    return {
        path: s3_links.presign(row.endpoint, region, keys, row.repository, s3_links.Location.from_dict(loc), seconds)
        for path, loc in (pinned.get("files") or {}).items()
    }
