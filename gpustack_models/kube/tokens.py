"""Short-lived tokens of the service's own ServiceAccount for one audience (TokenRequest).

The service never shows its kube-apiserver credential to anyone: the plugins it reads live bytes from get a
token whose audience is theirs alone (kube-apiserver refuses it), requested for a few minutes and renewed
before it runs out.
"""

from __future__ import annotations

import threading
import time

from django.conf import settings

from gpustack_models.kube.client import Kube, default


class AudienceToken:
    """``headers()``: an Authorization header with a current token of the service for ``audience``."""

    def __init__(self, client, audience: str, seconds: int):
        self._client = client  # a callable returning the Kube client
        self.audience = audience
        self.seconds = seconds
        self._lock = threading.Lock()
        self._token = ""
        self._renew_at = 0.0

    def token(self) -> str:
        with self._lock:
            if not self._token or time.monotonic() >= self._renew_at:
                self._token, lifetime = self._request(self._client())
                self._renew_at = time.monotonic() + lifetime * 0.6  # renewed well before it expires
            return self._token

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token()}"}

    def _request(self, client: Kube) -> tuple[str, float]:
        path = f"/api/v1/namespaces/{settings.NAMESPACE}/serviceaccounts/{settings.SERVICE_ACCOUNT}/token"
        spec = {"audiences": [self.audience], "expirationSeconds": self.seconds}
        answer = client.create(path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return answer["status"]["token"], float(self.seconds)


_plugin_token: AudienceToken | None = None


def plugin_token() -> AudienceToken:
    """The process-wide token the service shows the node plugins."""
    global _plugin_token
    if _plugin_token is None:
        _plugin_token = AudienceToken(default, settings.PLUGIN_TOKEN_AUDIENCE, settings.PLUGIN_TOKEN_SECONDS)
    return _plugin_token
