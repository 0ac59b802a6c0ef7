"""A process's own connection to kube-apiserver: raw HTTP, sync (urllib3) and async (aiohttp).

The service's roles load their credentials with the ``kubernetes`` client's loaders (a kubeconfig, or the
Pod's ServiceAccount in a cluster, with token rotation: ``load_configuration``); the node plugin with its
own small loader (``credentials``), so that it imports neither that package nor Django. The facade
forwards bytes, so it talks HTTP directly rather than through the generated typed API, which would decode
and re-encode every object.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlencode

import orjson
import urllib3

from gpustack_models import env_vars
from gpustack_models.kube.credentials import Credentials
from gpustack_models.kube.errors import error_for


@dataclass
class KubeResponse:
    status: int
    headers: dict
    data: bytes

    def json(self):
        return orjson.loads(self.data)

    def raise_for_status(self) -> KubeResponse:
        """This answer, or the ``StatusError`` of its reason when it is not a success."""
        if self.status >= 300:
            raise error_for(self.status, self.data)
        return self


def load_configuration(kubeconfig: str | None = None) -> Credentials:
    """The service's identity: an explicit kubeconfig, the in-cluster ServiceAccount, or the local one
    (the ``kubernetes`` client's loaders: every kubeconfig form, exec plugins included)."""
    from django.conf import settings
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    configuration = k8s_client.Configuration()
    path = kubeconfig if kubeconfig is not None else settings.KUBECONFIG
    if path:
        k8s_config.load_kube_config(config_file=path, client_configuration=configuration, persist_config=False)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=configuration)
    else:
        k8s_config.load_kube_config(
            config_file=str(settings.LOCAL_KUBECONFIG), client_configuration=configuration, persist_config=False
        )

    def bearer() -> str:  # the loaders refresh a rotating token here
        auth = configuration.auth_settings().get("BearerToken")
        return auth["value"] if auth and auth.get("value") else ""

    return Credentials(
        host=configuration.host.rstrip("/"),
        ca_file=configuration.ssl_ca_cert,
        cert_file=configuration.cert_file,
        key_file=configuration.key_file,
        verify=configuration.verify_ssl,
        bearer=bearer,
    )


class Kube:
    """One connection pool to kube-apiserver with one identity's credentials."""

    def __init__(self, credentials: Credentials, pool_size: int = 32, timeout: float | None = None):
        self.credentials = credentials
        self.host = credentials.host.rstrip("/")
        self.timeout = timeout or env_vars.kube_request_timeout()
        self.pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=pool_size,
            block=False,
            cert_reqs="CERT_REQUIRED" if credentials.verify else "CERT_NONE",
            ca_certs=credentials.ca_file,
            cert_file=credentials.cert_file,
            key_file=credentials.key_file,
            retries=False,
        )
        self._async_sessions: dict = {}

    def auth_headers(self) -> dict:
        return self.credentials.auth_headers()

    def url(self, path: str, query=None) -> str:
        if query:
            qs = query if isinstance(query, str) else urlencode(query, doseq=True)
            return f"{self.host}{path}?{qs}"
        return f"{self.host}{path}"

    # --- sync ----------------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        query=None,
        body: bytes | dict | list | None = None,
        headers: dict | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        stream: bool = False,
        read_timeout: float | None = None,
    ):
        """Send one request; returns a ``KubeResponse`` (or the raw urllib3 response when ``stream``, whose
        reads time out after ``read_timeout`` seconds of silence, if given)."""
        all_headers = {"Accept": "application/json", **self.auth_headers(), **(headers or {})}
        if body is not None and not isinstance(body, (bytes, bytearray)):
            body = orjson.dumps(body)
        if body is not None:
            all_headers.setdefault("Content-Type", content_type)
        timeout = timeout or self.timeout
        resp = self.pool.request(
            method,
            self.url(path, query),
            body=body,
            headers=all_headers,
            timeout=urllib3.Timeout(connect=10, read=read_timeout if stream else timeout),
            preload_content=not stream,
            redirect=False,
        )
        if stream:
            return resp
        return KubeResponse(resp.status, dict(resp.headers), resp.data)

    def json(self, method: str, path: str, **kwargs):
        """Send a request and decode the JSON answer; raise the ``StatusError`` of a non-2xx answer."""
        resp = self.request(method, path, **kwargs).raise_for_status()
        return resp.json() if resp.data else None

    def get(self, path: str, **kwargs):
        return self.json("GET", path, **kwargs)

    def create(self, path: str, body: dict, **kwargs):
        return self.json("POST", path, body=body, **kwargs)

    def apply(self, path: str, body: dict, *, field_manager: str, force: bool = True, **kwargs):
        """Server-side apply ``body`` at ``path`` (the object's own URL)."""
        query = {"fieldManager": field_manager, "force": "true" if force else "false"}
        return self.json("PATCH", path, body=body, query=query, content_type="application/apply-patch+yaml", **kwargs)

    def delete(self, path: str, **kwargs):
        return self.json("DELETE", path, **kwargs)

    # --- async (watch streams without a thread each) -------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext | bool:
        if not self.credentials.verify:
            return False
        context = ssl.create_default_context(cafile=self.credentials.ca_file)
        if self.credentials.cert_file:
            context.load_cert_chain(self.credentials.cert_file, self.credentials.key_file)
        return context

    def async_session(self):
        """An aiohttp session bound to the running event loop (one per loop)."""
        import aiohttp

        loop = asyncio.get_running_loop()
        session = self._async_sessions.get(loop)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl_context(), limit=0)
            session = aiohttp.ClientSession(connector=connector, trust_env=False)
            forget_closed_loops(self._async_sessions)
            self._async_sessions[loop] = session
        return session


def forget_closed_loops(sessions: dict) -> None:
    """Drop the sessions of event loops that are closed (a loop per call must not leave one each behind)."""
    for loop in [loop for loop in sessions if loop.is_closed()]:
        del sessions[loop]


_lock = threading.Lock()
_default: Kube | None = None


def default() -> Kube:
    """The process-wide client with the service's own identity (its ServiceAccount). The node plugin
    builds its own from ``credentials`` and passes it along."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                _default = Kube(load_configuration())
    return _default


def reset() -> None:
    global _default
    with _lock:
        _default = None
