"""The API's mount endpoint, as the plugin asks it with its Pod-bound token.

``POST /internal/v1/mounts`` authorizes a Pod's mount from the cluster (the Pod exists with that uid on
this node, the artifact is in its namespace and resolved) and records the mount as a reference, so the
digest enters this node's ``spec.models``; ``POST /internal/v1/mounts/release`` drops that reference.
The API's refusals are Kubernetes ``Status`` objects; each becomes the gRPC code the kubelet acts on,
with the Status message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import requests

from gpustack_models.plugin.csi.validation import CsiError, Pod

TIMEOUT_SECONDS = 15
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.PERMISSION_DENIED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
}


def code_for(http_status: int) -> grpc.StatusCode:
    """400 invalid, 401/403 denied, 404 not found, 409 a precondition; anything else: try again later."""
    return CODES.get(http_status, grpc.StatusCode.UNAVAILABLE)


def status_message(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        body = None
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str) or not message:
        message = f"the API answered {resp.status_code} {resp.reason or ''}".strip()
    return message[:1024]


@dataclass(frozen=True)
class MountGrant:
    digest: str
    artifact: str
    namespace: str
    size_bytes: int

    @classmethod
    def from_answer(cls, body) -> MountGrant:
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("digest"), str)
            or not _DIGEST.fullmatch(body["digest"])
        ):
            raise CsiError(grpc.StatusCode.UNAVAILABLE, "the API's answer carries no manifest digest")
        size = body.get("sizeBytes")
        return cls(
            digest=body["digest"],
            artifact=str(body.get("artifact") or ""),
            namespace=str(body.get("namespace") or ""),
            size_bytes=size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else 0,
        )


class MountClient:
    """The two calls, over HTTPS checked against the API's CA, with ``headers()`` (the bound token)."""

    def __init__(self, url: str, ca_file: str, node: str, headers: Callable[[], dict]):
        self.url, self.ca_file, self.node, self.headers = url.rstrip("/"), ca_file, node, headers
        # One keep-alive pool for every call: a kubelet waiting on a mount pays no TLS handshake.
        self.session = requests.Session()
        self.session.trust_env = False

    def _post(self, path: str, body: dict) -> requests.Response:
        try:
            return self.session.post(
                f"{self.url}{path}", json=body, headers=self.headers(), verify=self.ca_file, timeout=TIMEOUT_SECONDS
            )
        except (requests.RequestException, OSError) as exc:  # OSError: its CA file unreadable (an uninstall)
            raise CsiError(grpc.StatusCode.UNAVAILABLE, f"the API is unreachable: {exc}") from None

    def mount(self, volume_id: str, pod: Pod, artifact: str, expected_digest: str | None) -> MountGrant:
        body = {
            "node": self.node,
            "volumeId": volume_id,
            "pod": pod.as_dict(),
            "artifact": artifact,
            "expectedDigest": expected_digest,
        }
        resp = self._post("/internal/v1/mounts", body)
        if resp.status_code != 200:
            raise CsiError(code_for(resp.status_code), status_message(resp))
        try:
            return MountGrant.from_answer(resp.json())
        except ValueError:
            raise CsiError(grpc.StatusCode.UNAVAILABLE, "the API's answer is not JSON") from None

    def release(self, volume_id: str) -> None:
        """Raises ``CsiError`` unless the API acknowledged the release (unknown volumes included)."""
        resp = self._post("/internal/v1/mounts/release", {"node": self.node, "volumeId": volume_id})
        if resp.status_code != 200:
            raise CsiError(code_for(resp.status_code), status_message(resp))
