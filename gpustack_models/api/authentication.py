"""Delegated authentication of the aggregated API server.

Two ways in, as for any aggregated API server:

* kube-apiserver's front proxy: a client certificate chaining to the *requestheader* CA with a CN in the
  allowed names, both read from ConfigMap ``kube-system/extension-apiserver-authentication`` (watched).
  Only then are ``X-Remote-User``, ``X-Remote-Uid``, ``X-Remote-Group`` and ``X-Remote-Extra-*`` trusted.
  Header lines are read from the raw ASGI header list: one line per group, since a group name may
  contain a comma and Django's META joins repeated headers with commas.
* A bearer token, checked with a TokenReview.

Both answers are cached for ``AUTH_CACHE_TTL`` seconds, at most ``AUTH_CACHE_SIZE`` of each. Every
authenticated user also gets ``system:authenticated``, as kube-apiserver adds it.
"""

from __future__ import annotations

import datetime
import json
import logging
import ssl
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import unquote

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID
from django.conf import settings
from rest_framework.authentication import BaseAuthentication

from gpustack_models import kube
from gpustack_models.api import api_metrics
from gpustack_models.kube.errors import Unauthorized
from gpustack_models.kube.reviews import TokenReviewer
from gpustack_models.kube.watch import WatchHandler, WatchTarget, watch_forever

log = logging.getLogger(__name__)

AUTH_CONFIGMAP = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
AUTHENTICATED = "system:authenticated"


@dataclass(frozen=True)
class KubeUser:
    """The caller as Kubernetes knows it."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    # DRF and Django look for these.
    is_authenticated = True
    is_active = True

    @property
    def extra_dict(self) -> dict[str, list[str]]:
        return {k: list(v) for k, v in self.extra}

    def is_master(self) -> bool:
        return "system:masters" in self.groups

    def __str__(self) -> str:
        return self.username


def make_user(username: str, uid: str = "", groups=(), extra: dict | None = None) -> KubeUser:
    groups = tuple(groups)
    if AUTHENTICATED not in groups and username != "system:anonymous":
        groups = groups + (AUTHENTICATED,)
    extra_items = tuple(sorted((k, tuple(v)) for k, v in (extra or {}).items()))
    return KubeUser(username, uid, groups, extra_items)


# --- The requestheader configuration -------------------------------------------------------------------


@dataclass
class RequestHeaderConfig:
    ca_certs: list[x509.Certificate] = field(default_factory=list)
    allowed_names: list[str] = field(default_factory=list)
    username_headers: list[str] = field(default_factory=lambda: ["x-remote-user"])
    uid_headers: list[str] = field(default_factory=lambda: ["x-remote-uid"])
    group_headers: list[str] = field(default_factory=lambda: ["x-remote-group"])
    extra_prefixes: list[str] = field(default_factory=lambda: ["x-remote-extra-"])
    client_ca_pem: str = ""
    requestheader_ca_pem: str = ""
    resource_version: str = ""

    @classmethod
    def from_configmap(cls, configmap: dict) -> RequestHeaderConfig:
        data = configmap.get("data") or {}

        def names(key, default):
            raw = data.get(key)
            if not raw:
                return default
            return [h.lower() for h in json.loads(raw)]

        ca_pem = data.get("requestheader-client-ca-file", "")
        return cls(
            ca_certs=x509.load_pem_x509_certificates(ca_pem.encode()) if ca_pem else [],
            allowed_names=json.loads(data.get("requestheader-allowed-names") or "[]"),
            username_headers=names("requestheader-username-headers", ["x-remote-user"]),
            uid_headers=names("requestheader-uid-headers", ["x-remote-uid"]),
            group_headers=names("requestheader-group-headers", ["x-remote-group"]),
            extra_prefixes=names("requestheader-extra-headers-prefix", ["x-remote-extra-"]),
            client_ca_pem=data.get("client-ca-file", ""),
            requestheader_ca_pem=ca_pem,
            resource_version=(configmap.get("metadata") or {}).get("resourceVersion", ""),
        )

    def verify_front_proxy(self, der: bytes) -> bool:
        """True when the leaf certificate was issued by a requestheader CA, is valid now and its CN is
        allowed. The TLS handshake verified the chain against *all* trusted CAs; this narrows it."""
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            return False
        now = datetime.datetime.now(datetime.UTC)
        if not (cert.not_valid_before_utc <= now <= cert.not_valid_after_utc):
            return False
        if not any(_issued_by(cert, ca) for ca in self.ca_certs):
            return False
        if self.allowed_names:
            cns = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
            if not any(cn in self.allowed_names for cn in cns):
                return False
        return True

    def client_certificate_user(self, der: bytes) -> KubeUser | None:
        """The user of a client certificate issued by the cluster's client CA (``client-ca-file``), as
        kube-apiserver reads one: the CN is the user, each O a group. ``None`` for anything else."""
        try:
            cert = x509.load_der_x509_certificate(der)
            authorities = x509.load_pem_x509_certificates(self.client_ca_pem.encode()) if self.client_ca_pem else []
        except ValueError:
            return None
        now = datetime.datetime.now(datetime.UTC)
        if not (cert.not_valid_before_utc <= now <= cert.not_valid_after_utc):
            return None
        if not any(_issued_by(cert, ca) for ca in authorities):
            return None
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if not cns or not cns[0].value:
            return None
        groups = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        return make_user(str(cns[0].value), groups=[str(g) for g in groups])


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


USER_CACHE_SECONDS = 300.0

AUTH_CONFIGMAPS = WatchTarget(
    "/api/v1/namespaces/kube-system/configmaps", field_selector="metadata.name=extension-apiserver-authentication"
)


class RequestHeaderSource(WatchHandler):
    """Keeps the requestheader configuration current by watching its ConfigMap."""

    def __init__(self, client: kube.Kube | None = None):
        self._client = client
        self._config: RequestHeaderConfig | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._verified: dict[bytes, tuple[str, bool]] = {}
        self._users: dict[bytes, tuple[str, KubeUser | None, float]] = {}  # der -> (config, user, good until)
        self.listeners = []  # callables(config), e.g. to add a rotated CA to the TLS context

    @property
    def client(self) -> kube.Kube:
        return self._client or kube.default()

    def current(self) -> RequestHeaderConfig:
        if self._config is None:
            with self._lock:
                if self._config is None:
                    self._set(RequestHeaderConfig.from_configmap(self.client.get(AUTH_CONFIGMAP)))
                    self.start()
        return self._config

    def _set(self, config: RequestHeaderConfig) -> None:
        self._config = config
        self._verified, self._users = {}, {}
        for listener in self.listeners:
            try:
                listener(config)
            except Exception:  # a listener must not stop the watch
                log.exception("requestheader listener failed")

    def verified(self, der: bytes) -> bool:
        config = self.current()
        hit = self._verified.get(der)
        if hit is not None and hit[0] == config.resource_version:
            return hit[1]
        ok = config.verify_front_proxy(der)
        if len(self._verified) > 64:
            self._verified = {}
        self._verified[der] = (config.resource_version, ok)
        return ok

    def certificate_user(self, der: bytes) -> KubeUser | None:
        """``client_certificate_user`` of the current configuration, kept per certificate (its signature is
        checked once, not on every webhook call) until the certificate expires, at most
        ``USER_CACHE_SECONDS``, or the configuration changes (a rotated client CA)."""
        config, now = self.current(), time.time()
        hit = self._users.get(der)
        if hit is not None and hit[0] == config.resource_version and now < hit[2]:
            return hit[1]
        user = config.client_certificate_user(der)
        try:
            expires = x509.load_der_x509_certificate(der).not_valid_after_utc.timestamp()
        except ValueError:
            return user
        if len(self._users) > 64:
            self._users = {}
        self._users[der] = (config.resource_version, user, min(expires, now + USER_CACHE_SECONDS))
        return user

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=watch_forever,
                args=(self.client, AUTH_CONFIGMAPS, self, self._stop, "requestheader"),
                name="requestheader-watch",
                daemon=True,
            )
            self._thread.start()

    # --- WatchHandler: every version of the ConfigMap replaces the configuration ------------------------
    def page(self, items: list[dict]) -> None:
        for item in items:
            self.event("ADDED", item)

    def event(self, type_: str, obj: dict) -> None:
        if type_ == "DELETED":
            return  # keep the last configuration until a new one appears
        config = RequestHeaderConfig.from_configmap(obj)
        if self._config is None or config.resource_version != self._config.resource_version:
            self._set(config)
            log.info("requestheader configuration updated (resourceVersion %s)", config.resource_version)


requestheader = RequestHeaderSource()


# --- Reading the request --------------------------------------------------------------------------------


def raw_headers(request) -> list[tuple[str, str]]:
    """Header lines as received (lower-case names), one entry per line."""
    django_request = getattr(request, "_request", request)
    scope = getattr(django_request, "scope", None)
    if scope is not None:
        return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]
    # WSGI fallback (tests with Django's client): repeated lines are already joined; take them as one.
    out = []
    for key, value in django_request.META.items():
        if key.startswith("HTTP_"):
            out.append((key[5:].replace("_", "-").lower(), value))
    return out


def peer_certificate(request) -> bytes | None:
    """The verified client certificate (DER) from the ASGI ``tls`` extension, if the peer sent one."""
    django_request = getattr(request, "_request", request)
    scope = getattr(django_request, "scope", None) or {}
    tls = (scope.get("extensions") or {}).get("tls") or {}
    chain = tls.get("client_cert_chain") or []
    if not chain:
        return None
    leaf = chain[0]
    if isinstance(leaf, str):  # the ASGI tls extension carries PEM
        return ssl.PEM_cert_to_DER_cert(leaf)
    return leaf


def user_from_headers(headers: list[tuple[str, str]], config: RequestHeaderConfig) -> KubeUser | None:
    username = uid = ""
    groups: list[str] = []
    extra: dict[str, list[str]] = {}
    for name, value in headers:
        if name in config.username_headers and not username:
            username = value
        elif name in config.uid_headers and not uid:
            uid = value
        elif name in config.group_headers:
            groups.append(value)
        else:
            for prefix in config.extra_prefixes:
                if name.startswith(prefix):
                    key = unquote(name[len(prefix) :]).lower()
                    extra.setdefault(key, []).append(value)
                    break
    if not username:
        return None
    return make_user(username, uid, groups, extra)


# --- DRF authentication classes -------------------------------------------------------------------------


class FrontProxyAuthentication(BaseAuthentication):
    """kube-apiserver's front proxy: trusted identity headers behind a requestheader client certificate."""

    def authenticate(self, request):
        der = peer_certificate(request)
        if der is None or not requestheader.verified(der):
            return None
        user = user_from_headers(raw_headers(request), requestheader.current())
        if user is None:
            raise Unauthorized("front-proxy request without a user header")
        return user, "front-proxy"


class ClientCertificateAuthentication(BaseAuthentication):
    """A client certificate of the cluster's client CA (kube-apiserver calling a webhook presents one when
    its admission configuration says so). The front proxy's certificate is not a user here."""

    def authenticate(self, request):
        der = peer_certificate(request)
        if der is None or requestheader.verified(der):
            return None
        user = requestheader.certificate_user(der)
        return (user, "x509") if user is not None else None


_tokens = TokenReviewer(
    kube.default,
    lambda: settings.AUTH_CACHE_TTL,
    maxsize=settings.AUTH_CACHE_SIZE,
    observe=lambda hit: api_metrics.auth_cache("tokenreview", hit),
)


def review_token(token: str) -> KubeUser | None:
    """The user a bearer token belongs to (TokenReview), or None when kube-apiserver rejects it."""
    info = _tokens.review(token)
    if info is None:
        return None
    return make_user(info.get("username", ""), info.get("uid", ""), info.get("groups") or (), info.get("extra"))


def bearer_token(request) -> str | None:
    for name, value in raw_headers(request):
        if name == "authorization":
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


class TokenReviewAuthentication(BaseAuthentication):
    def authenticate(self, request):
        token = bearer_token(request)
        if token is None:
            return None
        user = review_token(token)
        if user is None:
            raise Unauthorized("Unauthorized")
        return user, "token"

    def authenticate_header(self, request):
        return 'Bearer realm="kubernetes"'
