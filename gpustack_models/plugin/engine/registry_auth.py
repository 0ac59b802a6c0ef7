"""Answering an OCI registry's challenges, for a download's registry sources.

A registry answers a blob asked for without a credential ``401`` with ``WWW-Authenticate``:

- ``Bearer realm="<token service>",service="<name>",scope="repository:<repo>:pull"``: the token service is
  asked (``GET <realm>?service=…&scope=…``, HTTP Basic with the source's credential, or anonymously without
  one) for a token, and the request is sent again with ``Authorization: Bearer <token>``. A token that
  expired is answered 401 again, and a new one is asked for;
- ``Basic``: the request is sent again with the credential itself.

The credential (``base64(user:password)``, the ticket's token of the source) goes only to the registry's
origin and to the token service it names, and over plain HTTP only to a token service on the registry's host.
The tokens are kept per source for the download (``RegistryAuth``), in memory only.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from urllib.parse import urlencode, urlsplit

from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.ticket import HubSource, origin
from gpustack_models.plugin.engine.transport import ConnectionPool, HttpError
from gpustack_models.sources.hub_errors import ACCESS_DENIED, SOURCE_UNAVAILABLE, transient

_PARAM = re.compile(r'(\w+)="([^"]*)"')
TOKEN_BODY_LIMIT = 64 * 1024


def parse_challenge(header: str | None) -> tuple[str, dict[str, str]]:
    """``(scheme, parameters)`` of a ``WWW-Authenticate`` value, the scheme lowercased."""
    scheme, _, rest = (header or "").strip().partition(" ")
    return scheme.lower(), {k.lower(): v for k, v in _PARAM.findall(rest)}


class RegistryAuth:
    """The ``Authorization`` header of each registry source of one download, learnt from its challenges."""

    def __init__(self, pool: ConnectionPool):
        self._pool = pool
        self._lock = threading.Lock()
        self._headers: dict[tuple, dict[str, str]] = {}

    def headers(self, hub: HubSource) -> dict[str, str]:
        with self._lock:
            return dict(self._headers.get(hub.key, {}))

    def answer(self, hub: HubSource, challenge: str | None, sent: Mapping[str, str]) -> bool:
        """Learn what answers ``challenge`` (the 401 a request with headers ``sent`` got). False when there
        is nothing new to send: the request is refused."""
        with self._lock:
            current = self._headers.get(hub.key)
        if current is not None and dict(current) != dict(sent):
            return True  # another request learnt a newer answer meanwhile
        scheme, params = parse_challenge(challenge)
        if scheme == "basic":
            if not hub.token or sent.get("Authorization", "").startswith("Basic "):
                return False
            learnt = {"Authorization": f"Basic {hub.token}"}
        elif scheme == "bearer" and params.get("realm"):
            learnt = {"Authorization": f"Bearer {self._token(hub, params)}"}
        else:
            return False
        with self._lock:
            self._headers[hub.key] = learnt
        return True

    def _token(self, hub: HubSource, params: dict[str, str]) -> str:
        realm = params["realm"]
        parts = urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
            raise DownloadFailed(ACCESS_DENIED, "the registry names a token service that is not an http(s) URL")
        query = {"scope": params.get("scope") or f"repository:{hub.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        url = f"{realm}{'&' if parts.query else '?'}{urlencode(query)}"
        # Over HTTPS, or over plain HTTP to the registry's own host only (a registry listed insecure).
        own_host = (parts.hostname or "").lower() == (urlsplit(hub.endpoint).hostname or "").lower()
        credentials = (
            {"Authorization": f"Basic {hub.token}"} if hub.token and (own_host or parts.scheme == "https") else {}
        )
        try:
            response = self._pool.get(
                url, credentials=credentials, credentials_origin=origin(realm), headers={"Accept": "application/json"}
            )
        except HttpError as exc:
            raise DownloadFailed(SOURCE_UNAVAILABLE, f"the registry's token service: {exc}") from None
        status, body = response.status, response.text(TOKEN_BODY_LIMIT)
        if status in (401, 403):
            raise DownloadFailed(ACCESS_DENIED, f"the registry's token service refused the credential (HTTP {status})")
        if transient(status) or status != 200:
            raise DownloadFailed(SOURCE_UNAVAILABLE, f"the registry's token service answered HTTP {status}")
        try:
            answer = json.loads(body)
            token = str(answer.get("token") or answer["access_token"])
        except (ValueError, KeyError, AttributeError):
            raise DownloadFailed(SOURCE_UNAVAILABLE, "the registry's token service answered no token") from None
        if not token.isprintable() or " " in token:
            raise DownloadFailed(SOURCE_UNAVAILABLE, "the registry's token service answered a malformed token")
        return token
