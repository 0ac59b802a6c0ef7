"""Typed readers of environment variables, shared by the Django settings and the node plugin (which runs
without Django: the settings module would load it).

Each helper raises ``ImproperlyConfigured`` naming the variable when its value is malformed, so a bad
deployment fails at start rather than at first use.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
_log = logging.getLogger(__name__)


class ImproperlyConfigured(ValueError):  # the name Django gives the same failure
    """A malformed environment variable."""


def env_renamed(name, old):
    """The variable to read for a setting renamed from ``old`` to ``name``: the new name when it is set
    (it wins over the old one), else the old one when set, which is deprecated and said so once, at start."""
    if old not in os.environ:
        return name
    if name in os.environ:
        _log.warning("%s is deprecated and ignored: %s is set", old, name)
        return name
    _log.warning("%s is deprecated: set %s instead", old, name)
    return old


def env_ports(name, default, count):
    """``count`` (a word: "five") ports separated by commas, or "free"; the setting's text, stripped."""
    value = env_str(name, default).strip()
    ports = value.split(",")
    number = {"three": 3, "five": 5}[count]
    if value != "free" and not (
        len(ports) == number and all(p.strip().isascii() and p.strip().isdigit() and 0 < int(p) < 65536 for p in ports)
    ):
        raise ImproperlyConfigured(f"{name}={value!r}: expected {count} ports separated by commas, or free")
    return value


def env_str(name, default=""):
    return os.environ.get(name, default)


def env_bool(name, default=False):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: expected one of true/false/1/0/yes/no/on/off")


def env_int(name, default, minimum=None, maximum=None):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value}: must be at most {maximum}")
    return value


def env_float(name, default, minimum=None):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value}: must be at least {minimum}")
    return value


def env_list(name, default=()):
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name):
    """Comma-separated IP addresses or CIDR networks, each normalised to a network ("10.0.0.0/8"); [] when unset."""
    networks = []
    for item in env_list(name):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {item!r} is not an IP address or CIDR network") from None
    return networks


def env_abs_path(name):
    """An absolute path, or "" when unset."""
    raw = os.environ.get(name, "")
    if raw and not os.path.isabs(raw):
        raise ImproperlyConfigured(f"{name}={raw!r}: must be an absolute path")
    return raw


def env_url(name, default, schemes):
    raw = os.environ.get(name) or default
    parts = urlsplit(raw)
    if parts.scheme not in schemes:
        raise ImproperlyConfigured(f"{name}={raw!r}: scheme must be one of {', '.join(sorted(schemes))}")
    if parts.scheme in ("http", "https", "redis", "rediss", "amqp") and not parts.hostname:
        raise ImproperlyConfigured(f"{name}={raw!r}: no host")
    return raw


# --- Read by the service and the node plugin alike (one definition each) ------------------------------
def data_dir() -> Path:
    """GPUSTACK_DATA_DIR: the local state (the local control plane, PKI, plugin caches by default)."""
    return Path(env_str("GPUSTACK_DATA_DIR", str(BASE_DIR / ".local"))).resolve()


def kubeconfig() -> str:
    """KUBECONFIG; unset: in-cluster credentials in a Pod, the local control plane's otherwise."""
    return env_str("KUBECONFIG", "")


def kube_request_timeout() -> float:
    return env_float("KUBE_REQUEST_TIMEOUT", 30.0, minimum=1.0)


def log_level() -> str:
    return env_str("LOG_LEVEL", "INFO").upper()


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # every role's lines
QUIET_LOGGERS = ("kubernetes", "urllib3")  # their INFO lines are every connection: WARNING and above only


def auth_cache_ttl() -> float:
    """GPUSTACK_AUTH_CACHE_TTL: how long a TokenReview or SubjectAccessReview answer is reused (seconds)."""
    return env_float("GPUSTACK_AUTH_CACHE_TTL", 10.0, minimum=0.0)


def api_port() -> int:
    return env_int("GPUSTACK_API_PORT", 8443, minimum=1, maximum=65535)


def plugin_port() -> int:
    return env_int("GPUSTACK_PLUGIN_PORT", 9443, minimum=1, maximum=65535)


def plugin_ca_file(data: Path) -> str:
    """GPUSTACK_PLUGIN_CA_FILE: the CA of the plugins' certificates."""
    return env_str("GPUSTACK_PLUGIN_CA_FILE", str(data / "plugin-pki" / "ca.crt"))


def plugin_peer_port() -> int:
    """GPUSTACK_PLUGIN_PEER_PORT: the plugins' peer port (0: no peer server, no peers in tickets)."""
    return env_int("GPUSTACK_PLUGIN_PEER_PORT", 8444, minimum=0, maximum=65535)
