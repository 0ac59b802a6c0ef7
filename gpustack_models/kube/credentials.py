"""Who a process is to kube-apiserver: its address, the CA it checks it against, and its own credential.

``Credentials`` is what ``kube.Kube`` connects with. The service's roles load theirs with the ``kubernetes``
client's loaders (``client.load_configuration``: any kubeconfig, exec plugins included). The node plugin,
which must stay small on every GPU node, loads its own here without importing that package (about 55 MB
of generated models): the Pod's ServiceAccount (``in_cluster``) or a kubeconfig with a token or a client
certificate (``from_kubeconfig``), the forms its chart and the local launcher give it. A kubeconfig asking
for anything else (an exec plugin, an auth provider, a password) is refused by name rather than ignored.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_SECONDS = 60.0  # bound tokens rotate; the kubelet refreshes the file well before expiry
_UNSUPPORTED_USER_KEYS = ("exec", "auth-provider", "username", "password", "as", "as-groups")


class CredentialsError(ValueError):
    """Credentials that cannot be loaded: the message names the file and the field."""


@dataclass(frozen=True)
class Credentials:
    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    bearer: Callable[[], str] | None = None  # the current ``Authorization`` value, read on each request

    def auth_headers(self) -> dict:
        value = self.bearer() if self.bearer else ""
        return {"Authorization": value} if value else {}

    def with_token(self, token: str) -> Credentials:
        """The same server and CA with ``token`` alone (no client certificate)."""
        return Credentials(self.host, self.ca_file, verify=self.verify, bearer=lambda: f"Bearer {token}")


class TokenFile:
    """A token file read again every ``TOKEN_REREAD_SECONDS`` (a projected ServiceAccount token rotates)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._read_at = -TOKEN_REREAD_SECONDS
        self._value = ""

    def __call__(self) -> str:
        with self._lock:
            if time.monotonic() - self._read_at >= TOKEN_REREAD_SECONDS:
                self._value = f"Bearer {self.path.read_text().strip()}"
                self._read_at = time.monotonic()
            return self._value


def in_cluster(account_dir: Path = SERVICE_ACCOUNT_DIR) -> Credentials:
    """The Pod's ServiceAccount: kube-apiserver at ``KUBERNETES_SERVICE_HOST:PORT``."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise CredentialsError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set in a Pod")
    host = f"[{host}]" if ":" in host else host
    token = account_dir / "token"
    if not token.is_file():
        raise CredentialsError(f"{token}: no ServiceAccount token (automountServiceAccountToken off?)")
    return Credentials(f"https://{host}:{port}", str(account_dir / "ca.crt"), bearer=TokenFile(token))


def from_kubeconfig(path: str | Path) -> Credentials:
    """The current context of the kubeconfig at ``path``: server, CA, and a token or client certificate."""
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CredentialsError(f"{path}: {exc}") from None
    context = _named(config, "contexts", config.get("current-context"), "context", path)
    cluster = _named(config, "clusters", context.get("cluster"), "cluster", path)
    user = _named(config, "users", context.get("user"), "user", path) if context.get("user") else {}
    for key in _UNSUPPORTED_USER_KEYS:
        if key in user:
            raise CredentialsError(f"{path}: users[].user.{key} is not supported by the node plugin")
    if not cluster.get("server"):
        raise CredentialsError(f"{path}: clusters[].cluster.server: Required value")
    files = _Files(path.parent)
    bearer = None
    if user.get("token"):
        value = f"Bearer {user['token']}"
        bearer = lambda: value  # noqa: E731
    elif user.get("tokenFile"):
        bearer = TokenFile(files.path(user["tokenFile"]))
    return Credentials(
        host=cluster["server"].rstrip("/"),
        ca_file=files.either(cluster, "certificate-authority"),
        cert_file=files.either(user, "client-certificate"),
        key_file=files.either(user, "client-key"),
        verify=not cluster.get("insecure-skip-tls-verify", False),
        bearer=bearer,
    )


def _named(config: dict, section: str, name, key: str, path: Path) -> dict:
    for entry in config.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(key), dict):
            return entry[key]
    raise CredentialsError(f"{path}: {section}: no entry named {name!r}")


class _Files:
    """A kubeconfig's file fields: paths relative to its directory, or ``-data`` written to private files."""

    _dir: str | None = None
    _lock = threading.Lock()

    def __init__(self, base: Path):
        self.base = base

    def path(self, value: str) -> str:
        return str(self.base / value)

    def either(self, section: dict, key: str) -> str | None:
        if section.get(f"{key}-data"):
            return self._written(base64.b64decode(section[f"{key}-data"]))
        return self.path(section[key]) if section.get(key) else None

    @classmethod
    def _written(cls, data: bytes) -> str:
        with cls._lock:
            if cls._dir is None:
                cls._dir = tempfile.mkdtemp(prefix="kubeconfig-")  # 0700: the key stays the process's
                atexit.register(shutil.rmtree, cls._dir, True)
        fd, name = tempfile.mkstemp(dir=cls._dir)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        return name
