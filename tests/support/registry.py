"""A real OCI registry for the OCI sources: Debian's ``docker-registry`` (distribution 2.8) behind token
auth, the token server it trusts, and a small push client speaking the distribution API.

``TokenServer`` speaks distribution's token protocol (``GET realm?service=…&scope=repository:ns/repo:pull``
with Basic credentials or none → an ES256 JWT granting what the user's ACL allows of it) and logs each
request. ``Registry`` runs ``docker-registry serve`` on a free loopback port trusting that server, and pushes
blobs, manifests, ModelPack artifacts and image indexes with ``requests`` through the 401 challenge → token
→ retry a real client goes through. The session's registry is the ``registry`` fixture: tests use
repositories and users of their own. distribution 2.8 serves an OCI manifest only to a client accepting its
media type: read with ``get_manifest``, or send ``MANIFEST_ACCEPT``.
"""

from __future__ import annotations

import atexit
import base64
import datetime
import hashlib
import http.server
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from gpustack_models.local.cluster import free_port
from gpustack_models.local.stopping import die_with_parent
from tests.support.paths import TEST_STATE
from tests.support.waiting import wait_for

BINARY = "/usr/bin/docker-registry"  # Debian's docker-registry package (tests/services.py installs it)
SERVICE = "test-registry"  # the tokens' audience
ISSUER = "test-issuer"
TOKEN_SECONDS = 300

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER = "application/vnd.docker.distribution.manifest"
MANIFEST_ACCEPT = f"{OCI_MANIFEST}, {OCI_INDEX}, {DOCKER}.v2+json, {DOCKER}.list.v2+json"
# CNCF ModelPack (github.com/modelpack/model-spec): an OCI image manifest with these types.
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
MODEL_WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
MODEL_WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
TITLE = "org.opencontainers.image.title"  # the ORAS convention
FILEPATH = "org.cncf.model.filepath"  # ModelPack's own

User = tuple[str, str]  # (name, password)
Acl = dict[str, set[str]]  # repository prefix → actions


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class RegistryError(Exception):
    """The registry or its token server refused a request; ``response`` is its answer."""

    def __init__(self, response: requests.Response, what: str):
        self.response = response
        challenge = response.headers.get("WWW-Authenticate", "")
        super().__init__(f"{what}: {response.status_code} {challenge} {response.text[:500]}")


@dataclass
class TokenRequest:
    """One request to the token server: who asked (None: anonymous), for which scopes, what it got."""

    username: str | None
    scopes: list[str]
    granted: list[dict] = field(default_factory=list)
    status: int = 200


def parse_scope(scope: str) -> tuple[str, str, list[str]] | None:
    """``repository:ns/repo:pull,push`` → ``("repository", "ns/repo", ["pull", "push"])`` (None: malformed)."""
    kind, _, rest = scope.partition(":")
    name, _, actions = rest.rpartition(":")
    if not kind or not name:
        return None
    return kind, name, [a for a in actions.split(",") if a]


def allowed(acl: Acl, repository: str) -> set[str]:
    """The actions ``acl`` allows on ``repository``: those of every prefix it starts with."""
    return set().union(*(actions for prefix, actions in acl.items() if repository.startswith(prefix)))


class TokenServer:
    """The registry's token server on a free loopback port, signing with its own self-signed ES256 key.

    ``users`` maps a name to ``(password, acl)``; an anonymous request gets what ``anonymous`` (an ACL,
    empty by default) allows. A wrong password or an unknown user is answered 401. ``requests`` is the log
    of every request, in arrival order."""

    def __init__(self, service: str = SERVICE, issuer: str = ISSUER):
        self.service = service
        self.issuer = issuer
        self.users: dict[str, tuple[str, Acl]] = {}
        self.anonymous: Acl = {}
        self.requests: list[TokenRequest] = []
        self.lock = threading.Lock()
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = _self_signed(self.key, "registry token signer")
        self.server: http.server.ThreadingHTTPServer | None = None
        self.port = 0

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def cert_pem(self) -> bytes:
        """The registry's ``rootcertbundle``: the signing certificate itself."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def start(self) -> TokenServer:
        self.server = _TokenHTTPServer(("127.0.0.1", free_port()), self)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="registry token server", daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def grant(self, acl: Acl, scopes: list[str]) -> list[dict]:
        """The access claim for ``scopes``: each repository's requested actions that ``acl`` allows."""
        access = []
        for scope in scopes:
            parsed = parse_scope(scope)
            if parsed is None or parsed[0] != "repository":
                continue  # nothing but repositories here (no catalog)
            _, name, wanted = parsed
            have = allowed(acl, name)
            actions = sorted(have if "*" in wanted else set(wanted) & have)
            if actions:
                access.append({"type": "repository", "name": name, "actions": actions})
        return access

    def issue(self, subject: str, access: list[dict], seconds: int = TOKEN_SECONDS) -> str:
        """A compact JWS (ES256) the registry accepts: the certificate rides in ``x5c``."""
        der = base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()
        header = {"typ": "JWT", "alg": "ES256", "x5c": [der]}
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": subject, "aud": self.service}  # aud a string: 2.8 refuses a list
        claims.update(exp=now + seconds, nbf=now - 1, iat=now, jti=secrets.token_hex(12), access=access)
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def answer(self, authorization: str | None, query: dict[str, list[str]]) -> tuple[int, dict]:
        """The status and JSON body for a token request (and its entry in the log)."""
        scopes = [s for value in query.get("scope", []) for s in value.split()]
        username, acl = self._authenticate(authorization)
        entry = TokenRequest(username, scopes)
        with self.lock:
            self.requests.append(entry)
        if acl is None:
            entry.status = 401
            return 401, {"errors": [{"code": "UNAUTHORIZED", "message": "wrong user name or password"}]}
        if query.get("service", [self.service])[0] != self.service:
            entry.status = 400
            return 400, {"errors": [{"code": "DENIED", "message": "unknown service"}]}
        entry.granted = self.grant(acl, scopes)
        token = self.issue(username or "", entry.granted)
        issued_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return 200, {"token": token, "access_token": token, "expires_in": TOKEN_SECONDS, "issued_at": issued_at}

    def _authenticate(self, authorization: str | None) -> tuple[str | None, Acl | None]:
        """``(username, acl)``; ``(name, None)`` for credentials that do not match."""
        if not authorization:
            return None, self.anonymous
        scheme, _, value = authorization.partition(" ")
        try:
            name, _, password = base64.b64decode(value).decode().partition(":")
        except ValueError:
            return None, None
        user = self.users.get(name)
        if scheme.lower() != "basic" or user is None or not secrets.compare_digest(user[0], password):
            return name, None
        return name, user[1]


def _self_signed(key: ec.EllipticCurvePrivateKey, name: str) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=2))
    builder = x509.CertificateBuilder(subject, subject, key.public_key(), x509.random_serial_number(), *valid)
    return builder.sign(key, hashes.SHA256())


class _TokenHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, tokens: TokenServer):
        self.tokens = tokens
        super().__init__(address, _TokenHandler)


class _TokenHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _TokenHTTPServer

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        if url.path != "/token":
            status, body = 404, {"errors": [{"code": "NOT_FOUND", "message": url.path}]}
        else:
            query = urllib.parse.parse_qs(url.query)
            status, body = self.server.tokens.answer(self.headers.get("Authorization"), query)
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if status == 401:
            self.send_header("WWW-Authenticate", f'Basic realm="{self.server.tokens.realm}"')
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format, *args):
        pass  # the log is TokenServer.requests


def challenge(header: str) -> dict[str, str]:
    """The parameters of a ``Bearer realm="…",service="…",scope="…"`` challenge ({} when not Bearer)."""
    scheme, _, params = header.partition(" ")
    if scheme.lower() != "bearer":
        return {}
    return dict(re.findall(r'(\w+)="([^"]*)"', params))


class Registry:
    """``docker-registry serve`` on a free loopback port, trusting its own ``TokenServer`` (``tokens``).

    ``host`` and ``url`` address it; ``add_user`` gives a user pull/push on repository prefixes. The push
    and read helpers take ``user=(name, password)`` (None: anonymous) and raise ``RegistryError`` when
    refused. Start with ``start()`` (or ``with Registry() as registry:``), stop with ``stop()``; the
    process also stops with the process that started it, however that ends."""

    def __init__(self):
        self.tokens = TokenServer()
        self.port = 0
        self.root: Path | None = None
        self.proc: subprocess.Popen | None = None
        self._local = threading.local()
        self._cache: dict[tuple, tuple[str, float]] = {}  # (user, scopes) → (token, monotonic expiry)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def start(self) -> Registry:
        if not Path(BINARY).exists():
            raise RuntimeError(f"no {BINARY}: run the suite with python -m tests.services (it installs it)")
        TEST_STATE.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="registry-", dir=TEST_STATE))
        atexit.register(self.stop)  # stopped when the session ends, even without its teardown
        try:
            self._launch()
            wait_for(self._ready, timeout=30, message="docker-registry to listen")
        except BaseException:
            self.stop()  # not left running (a session that failed here has no teardown for it)
            raise
        return self

    def _launch(self) -> None:
        self.tokens.start()
        self.port = free_port()
        (self.root / "token-signer.crt").write_bytes(self.tokens.cert_pem())
        (self.root / "config.yml").write_text(json.dumps(self._config(), indent=1))  # JSON is YAML
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}  # no overrides
        argv = [BINARY, "serve", str(self.root / "config.yml")]
        with open(self.root / "registry.log", "ab") as log:  # PR_SET_PDEATHSIG: gone with a killed session too
            self.proc = subprocess.Popen(argv, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent)  # fmt: skip

    def _config(self) -> dict:
        token = {"realm": self.tokens.realm, "service": self.tokens.service, "issuer": self.tokens.issuer,
                 "rootcertbundle": str(self.root / "token-signer.crt")}  # fmt: skip
        return {
            "version": "0.1",
            "log": {"level": "warn", "accesslog": {"disabled": True}},  # the access log goes to stdout
            "storage": {
                "filesystem": {"rootdirectory": str(self.root / "data")},
                "delete": {"enabled": True},
                "maintenance": {"uploadpurging": {"enabled": False}},
            },
            "http": {"addr": self.host, "secret": secrets.token_hex(16)},
            "auth": {"token": token},
        }

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            log = (self.root / "registry.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"docker-registry exited with {self.proc.returncode}: {log}")
        try:
            return self._session().get(f"{self.url}/v2/", timeout=2).status_code == 401
        except requests.RequestException:
            return False

    def stop(self) -> None:
        atexit.unregister(self.stop)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.tokens.stop()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- users

    def add_user(self, name: str, password: str, pull=(), push=(), delete=()) -> User:
        """A user allowed ``pull``/``push``/``delete`` on the repositories starting with the given prefixes
        (push alone does not imply pull). Returns ``(name, password)`` for the helpers' ``user``."""
        self.tokens.users[name] = (password, _acl(pull, push, delete))
        return name, password

    def allow_anonymous(self, pull=(), push=()) -> None:
        """Let clients without credentials pull (or push) the repositories starting with these prefixes."""
        self.tokens.anonymous = _acl(pull, push, ())

    # ---------------------------------------------------------------- the token flow

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.trust_env = False  # no proxy between the suite and its loopback registry
        return session

    def token(self, user: User | None, scopes: list[str]) -> str:
        """A token from the token server for ``scopes`` (raises ``RegistryError`` if it refuses)."""
        key = (user, tuple(scopes))
        cached = self._cache.get(key)
        if cached and cached[1] > time.monotonic():
            return cached[0]
        params = {"service": self.tokens.service, "scope": scopes}
        response = self._session().get(self.tokens.realm, params=params, auth=user, timeout=30)
        if response.status_code != 200:
            raise RegistryError(response, "token server")
        token = response.json()["token"]
        self._cache[key] = (token, time.monotonic() + TOKEN_SECONDS - 30)
        return token

    def request(self, method: str, path: str, user: User | None = None, **kwargs) -> requests.Response:
        """``method`` on ``path`` (or a full URL) as a client would: on a Bearer challenge, a token for the
        scope it names and the request again. An ``Authorization`` header of the caller's is sent as is."""
        url = urllib.parse.urljoin(self.url, path)
        kwargs.setdefault("timeout", 60)
        headers = dict(kwargs.pop("headers", None) or {})
        response = self._session().request(method, url, headers=headers, **kwargs)
        if response.status_code != 401 or "Authorization" in headers:
            return response
        params = challenge(response.headers.get("WWW-Authenticate", ""))
        if "realm" not in params:
            return response
        scopes = params["scope"].split() if params.get("scope") else []
        headers["Authorization"] = f"Bearer {self.token(user, scopes)}"
        return self._session().request(method, url, headers=headers, **kwargs)

    # ---------------------------------------------------------------- pushing and reading

    def push_blob(self, repository: str, data: bytes, user: User | None = None) -> str:
        """Upload ``data`` (a monolithic POST + PUT upload); returns its digest."""
        digest = sha256_digest(data)
        started = self.request("POST", f"/v2/{repository}/blobs/uploads/", user)
        if started.status_code != 202:
            raise RegistryError(started, f"starting an upload to {repository}")
        location = urllib.parse.urljoin(self.url, started.headers["Location"])
        separator = "&" if "?" in location else "?"
        headers = {"Content-Type": "application/octet-stream"}
        done = self.request("PUT", f"{location}{separator}digest={digest}", user, data=data, headers=headers)
        if done.status_code != 201:
            raise RegistryError(done, f"uploading {digest} to {repository}")
        if done.headers.get("Docker-Content-Digest") != digest:
            raise AssertionError(f"the registry stored {done.headers.get('Docker-Content-Digest')}, not {digest}")
        return digest

    def push_manifest(
        self, repository: str, reference: str, manifest: dict | bytes, media_type: str = OCI_MANIFEST,
        user: User | None = None,
    ) -> str:  # fmt: skip
        """PUT ``manifest`` (bytes as they are; a dict as compact JSON) under ``reference``; returns the
        digest the registry answers, checked against the bytes sent."""
        body = manifest if isinstance(manifest, bytes) else json.dumps(manifest, separators=(",", ":")).encode()
        headers = {"Content-Type": media_type}
        response = self.request("PUT", f"/v2/{repository}/manifests/{reference}", user, data=body, headers=headers)
        if response.status_code != 201:
            raise RegistryError(response, f"putting manifest {repository}:{reference}")
        digest = response.headers.get("Docker-Content-Digest")
        if digest != sha256_digest(body):
            raise AssertionError(f"the registry answered digest {digest} for a manifest of {sha256_digest(body)}")
        return digest

    def push_modelpack(
        self, repository: str, tag: str, files: dict[str, bytes], user: User | None = None,
        filepath_annotation: bool = True,
    ) -> str:  # fmt: skip
        """A CNCF ModelPack artifact of ``files`` (path → content), one raw layer each, in their order;
        returns the manifest's digest. ``filepath_annotation=False`` leaves out ``org.cncf.model.filepath``
        (only the ORAS title names the file, as ``oras push`` makes it)."""
        layers = []
        for path, data in files.items():
            annotations = {TITLE: path, FILEPATH: path} if filepath_annotation else {TITLE: path}
            media_type = MODEL_WEIGHT_CONFIG if path.endswith(".json") else MODEL_WEIGHT
            digest = self.push_blob(repository, data, user)
            layers.append({"mediaType": media_type, "digest": digest, "size": len(data), "annotations": annotations})
        modelfs = {"type": "layers", "diffIds": [layer["digest"] for layer in layers]}  # raw: digest = diffID
        config = {"descriptor": {"name": repository.rsplit("/", 1)[-1]}, "modelfs": modelfs}
        config_bytes = json.dumps(config, separators=(",", ":")).encode()
        config_ref = {"mediaType": MODEL_CONFIG, "digest": self.push_blob(repository, config_bytes, user),
                      "size": len(config_bytes)}  # fmt: skip
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": MODEL_ARTIFACT}
        manifest.update(config=config_ref, layers=layers)
        return self.push_manifest(repository, tag, manifest, OCI_MANIFEST, user)

    def push_index(
        self, repository: str, tag: str, manifests: list[tuple[str, int | None, dict | None]],
        user: User | None = None,
    ) -> str:  # fmt: skip
        """An OCI image index of ``manifests`` — ``(digest, size, platform)`` of manifests already in
        ``repository``; a size of None is the manifest's real one — under ``tag``; returns its digest."""
        entries = []
        for digest, size, platform in manifests:
            body, media_type, _ = self.get_manifest(repository, digest, user)
            entry = {"mediaType": media_type, "digest": digest, "size": len(body) if size is None else size}
            artifact_type = json.loads(body).get("artifactType")
            if artifact_type:
                entry["artifactType"] = artifact_type
            if platform is not None:
                entry["platform"] = platform
            entries.append(entry)
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
        return self.push_manifest(repository, tag, index, OCI_INDEX, user)

    def tag(self, repository: str, tag: str, digest: str, user: User | None = None) -> str:
        """Point ``tag`` at the manifest ``digest`` (its bytes PUT again under the tag); returns the digest."""
        body, media_type, _ = self.get_manifest(repository, digest, user)
        return self.push_manifest(repository, tag, body, media_type, user)

    def get_manifest(self, repository: str, reference: str, user: User | None = None) -> tuple[bytes, str, str]:
        """``(bytes, media type, digest)`` of the manifest ``reference`` (a tag or digest) as the registry
        serves it."""
        headers = {"Accept": MANIFEST_ACCEPT}
        response = self.request("GET", f"/v2/{repository}/manifests/{reference}", user, headers=headers)
        if response.status_code != 200:
            raise RegistryError(response, f"getting manifest {repository}:{reference}")
        return response.content, response.headers["Content-Type"], response.headers["Docker-Content-Digest"]


def _acl(pull, push, delete) -> Acl:
    acl: Acl = {}
    for action, prefixes in (("pull", pull), ("push", push), ("delete", delete)):
        for prefix in (prefixes,) if isinstance(prefixes, str) else prefixes:
            acl.setdefault(prefix, set()).add(action)
    return acl


@pytest.fixture(scope="session")
def registry():
    """The session's registry (started on first use). Tests use repositories and users of their own."""
    with Registry() as started:
        yield started
