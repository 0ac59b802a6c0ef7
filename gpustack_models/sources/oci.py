"""Resolve an OCI reference (a model artifact in a registry) to its manifest digest and its files.

An OCI artifact in the CNCF ModelPack style (or any artifact whose layers are files): each layer is one
file, named by its ``org.cncf.model.filepath`` annotation, else ``org.opencontainers.image.title``; the
file's sha256 is the layer's digest and its size the layer's, so nothing is downloaded to resolve it, and
a node fetches each file as ``GET /v2/<repository>/blobs/<digest>`` (ranges allowed) and checks it
against that digest. A tag is pinned here to the manifest digest it names now (the "commit"); a
reference with ``@sha256:...`` is checked against the bytes the registry answers. An image index picks
the manifest of the platform asked for (``linux/amd64`` by default), or its only manifest.

A model *image* (a modelcar: files under a path of the image's flattened tar layers) is refused with
``InvalidManifest`` for now, as are artifact layers that are archives (``.tar``, ``+gzip``, ``+zstd``):
their files cannot be fetched by byte range from the registry.

Authentication follows the distribution spec: a request answered 401 with ``WWW-Authenticate: Bearer
realm=...,service=...,scope=...`` asks the realm for a token (HTTP Basic with the Secret's credentials, or
anonymously) and is sent again with it; ``Basic`` challenges get the credentials themselves. Credentials
go over plain HTTP only to the registry's own host (``credentials_may_go``).

Registries are reached over HTTPS unless listed as insecure (``insecure_registries``: ``host`` or
``host:port``), as container runtimes do. No Django and no Kubernetes here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import requests

from gpustack_models.kinds.oci_reference import DIGEST, DOCKER_HUB, DOCKER_HUB_ALIASES, Reference, endpoint, registry_of  # noqa: F401 (re-exported)
from gpustack_models.sources import oci_layers
from gpustack_models.sources.hub_errors import (
    AccessDenied,
    InvalidManifest,
    RevisionNotFound,
    SourceUnavailable,
    retry_after_seconds,
    transient,
)
from gpustack_models.sources.manifest import InvalidPath, ManifestFile, ResolvedRevision

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
INDEXES = (OCI_INDEX, DOCKER_LIST)
ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
IMAGE_CONFIGS = ("application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json")
MODELPACK_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
FILEPATH = "org.cncf.model.filepath"
TITLE = "org.opencontainers.image.title"
ARCHIVE_SUFFIXES = (".tar", "+gzip", "+zstd", ".tar.gz", "tar+gzip", "tar+zstd")
DEFAULT_PLATFORM = "linux/amd64"
MANIFEST_LIMIT = 4 * 1024 * 1024  # what registries themselves accept for a manifest


@dataclass(frozen=True, repr=False)
class Credentials:
    """A user name and password for one registry (from a ``.dockerconfigjson``); never in a repr."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=<redacted>)"

    @property
    def basic(self) -> str:
        """``base64(username:password)``: the ``auth`` of a Docker config, what an HTTP Basic header carries."""
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    """``(scheme, parameters)`` of a ``WWW-Authenticate`` value such as ``Bearer realm="…",service="…"``."""
    scheme, _, rest = (header or "").strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}
    return scheme.lower(), params


class Registry:
    """Requests to one repository of one registry, authenticated as the registry asks."""

    def __init__(self, base: str, repository: str, credentials: Credentials | None, *, proxy, ca_bundle, timeout):
        self.base, self.repository, self.credentials, self.timeout = base.rstrip("/"), repository, credentials, timeout
        self.session = requests.Session()
        self.session.trust_env = False  # never the environment's proxy or CA variables
        self.session.proxies = {"http": proxy, "https": proxy} if proxy else {}
        self.session.verify = ca_bundle or True
        self.authorization: str | None = None

    def get(self, path: str, accept: str | None = None, stream: bool = False) -> requests.Response:
        """``GET <base>/v2/<repository>/<path>``, answering one authentication challenge on the way. ``stream``
        (a blob): the body is read as it comes, and a redirect to the registry's storage is followed (without
        the credentials, which go to the registry's origin only)."""
        url = f"{self.base}/v2/{self.repository}/{path}"
        response = self._send(url, accept, stream)
        if response.status_code == 401 and self._authenticate(response.headers.get("WWW-Authenticate", "")):
            response.close()
            response = self._send(url, accept, stream)
        return response

    def _send(self, url: str, accept: str | None, stream: bool = False) -> requests.Response:
        headers = {"Accept": accept} if accept else {}
        if self.authorization:
            headers["Authorization"] = self.authorization
        try:
            return self.session.get(url, headers=headers, timeout=self.timeout, allow_redirects=stream, stream=stream)
        except requests.RequestException as exc:
            raise SourceUnavailable(f"the registry {self.base} did not answer: {type(exc).__name__}") from None

    def _authenticate(self, header: str) -> bool:
        """Answer a challenge; False when there is nothing new to try."""
        scheme, params = _challenge(header)
        if scheme == "basic":
            if self.credentials is None or self.authorization:
                return False
            self.authorization = f"Basic {self.credentials.basic}"
            return True
        if scheme != "bearer" or not params.get("realm") or (self.authorization or "").startswith("Bearer"):
            return False
        self.authorization = f"Bearer {self._token(params)}"
        return True

    def _token(self, params: dict[str, str]) -> str:
        realm = params["realm"]
        if urlsplit(realm).scheme not in ("http", "https"):
            raise AccessDenied(f"the registry {self.base} names a token service that is not an http(s) URL")
        auth = None
        if self.credentials is not None and credentials_may_go(realm, self.base):
            auth = (self.credentials.username, self.credentials.password)
        query = {"scope": params.get("scope") or f"repository:{self.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        try:
            response = self.session.get(realm, params=query, auth=auth, timeout=self.timeout, allow_redirects=False)
        except requests.RequestException as exc:
            raise SourceUnavailable(f"the registry's token service did not answer: {type(exc).__name__}") from None
        if response.status_code in (401, 403):
            who = "the Secret's credentials" if self.credentials else "an anonymous request (no secretRef)"
            raise AccessDenied(f"the registry's token service refused {who} (HTTP {response.status_code})")
        _raise_unavailable(response, "the registry's token service")
        try:
            body = response.json()
            return str(body.get("token") or body["access_token"])
        except (ValueError, KeyError, AttributeError):
            raise SourceUnavailable("the registry's token service answered no token") from None


def credentials_may_go(realm: str, base: str) -> bool:
    """Whether the registry's credentials may go to the token service at ``realm``: over HTTPS, or over
    plain HTTP to the registry's own host (a registry listed insecure, its token service beside it)."""
    parts = urlsplit(realm)
    return parts.scheme == "https" or (parts.hostname or "").lower() == (urlsplit(base).hostname or "").lower()


def _raise_unavailable(response: requests.Response, who: str) -> None:
    status = response.status_code
    if transient(status) or not 200 <= status < 300:
        message = f"{who} answered HTTP {status}"
        raise SourceUnavailable(message, retry_after=retry_after_seconds(response.headers.get("Retry-After")))


def _error_codes(response: requests.Response) -> set[str]:
    try:
        return {str(e.get("code")) for e in response.json().get("errors") or []}
    except (ValueError, AttributeError, TypeError):
        return set()


def fetch_manifest(registry: Registry, ref: str, said: str) -> tuple[bytes, str, dict]:
    """``(bytes, digest, parsed)`` of the manifest ``ref`` names (a tag or a digest); ``said`` names it in messages."""
    response = registry.get(f"manifests/{ref}", ACCEPT)
    if response.status_code in (401, 403):
        shown = "the Secret's credentials" if registry.credentials else "no credentials (no secretRef)"
        raise AccessDenied(f"the registry refused {said} with {shown} (HTTP {response.status_code})")
    if response.status_code == 404:
        codes = _error_codes(response)
        if "NAME_UNKNOWN" in codes:
            raise AccessDenied(f"the repository of {said} does not exist, or the credentials given cannot see it")
        raise RevisionNotFound(f"{said}: the registry has no such tag or manifest")
    _raise_unavailable(response, f"the registry, asked for {said},")
    body = response.content
    if len(body) > MANIFEST_LIMIT:
        raise InvalidManifest(f"{said}: the manifest is larger than {MANIFEST_LIMIT} bytes")
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if DIGEST.fullmatch(ref) and ref != digest:
        raise InvalidManifest(f"{said}: the registry answered bytes whose digest is {digest}")
    try:
        parsed = json.loads(body)
    except ValueError:
        raise InvalidManifest(f"{said}: the manifest is not JSON") from None
    if not isinstance(parsed, dict):
        raise InvalidManifest(f"{said}: the manifest is not a JSON object")
    return body, digest, parsed


def pick_platform(index: dict, platform: str, said: str) -> str:
    """The digest of the manifest of ``platform`` (``os/arch[/variant]``) in an index; its only manifest
    when none names a platform."""
    manifests = [m for m in index.get("manifests") or [] if isinstance(m, dict)]
    wanted = platform.split("/")
    for m in manifests:
        p = m.get("platform") or {}
        named = [p.get("os"), p.get("architecture"), p.get("variant")][: len(wanted)]
        if named == wanted:
            return str(m.get("digest"))
    if len(manifests) == 1 and not manifests[0].get("platform"):
        return str(manifests[0].get("digest"))
    offered = sorted({_platform_of(m) for m in manifests} - {""})
    raise RevisionNotFound(
        f"{said} is an index with no manifest for {platform} (it has: {', '.join(offered) or 'none'})"
    )


def _platform_of(descriptor: dict) -> str:
    p = descriptor.get("platform") or {}
    return "/".join(str(p[k]) for k in ("os", "architecture", "variant") if p.get(k))


def _layers(manifest: dict, said: str) -> list:
    config, layers = manifest.get("config"), manifest.get("layers") or []
    if not isinstance(config, dict | None) or not isinstance(layers, list):
        raise InvalidManifest(f"{said}: the manifest's config or layers are malformed")
    return layers


def is_image(manifest: dict) -> bool:
    """A container image (a modelcar): files under a path of its flattened layers; else an artifact."""
    config = manifest.get("config")
    return isinstance(config, dict) and config.get("mediaType") in IMAGE_CONFIGS and not manifest.get("artifactType")


def artifact_files(manifest: dict, path: str | None, said: str, registry=None, extents=None) -> list[ManifestFile]:
    """The files of an artifact manifest: a file layer is a file named by its annotations; with ``registry``,
    a tar layer (compressed or not) is read for the files in it (their places go to ``extents``); under ``path``."""
    layers = _layers(manifest, said)
    if is_image(manifest):
        raise InvalidManifest(f"{said} is a container image, not an artifact")
    prefix = f"{path.strip('/')}/" if path and path.strip("/") else ""
    files = []
    for layer in layers:
        media_type = str(layer.get("mediaType") or "") if isinstance(layer, dict) else ""
        if registry is not None and oci_layers.is_tar(media_type):
            files.extend(_tar_files(registry, [layer], prefix, said, extents))
        else:
            files.extend(_layer_file(layer, prefix, said))
    return files


def image_files(registry, manifest: dict, path: str | None, said: str, extents: dict) -> list[ManifestFile]:
    """The files under ``path`` (``models`` by default, as KServe's modelcar) of an image's flattened layers."""
    layers = _layers(manifest, said)
    for layer in layers:
        media_type = str(layer.get("mediaType") or "") if isinstance(layer, dict) else ""
        if not oci_layers.is_tar(media_type):
            raise InvalidManifest(
                f"{said}: a layer is {media_type or 'not a layer'}: an image's layers must be tar archives"
                " (uncompressed, gzip or zstd)"
            )
    return _tar_files(registry, layers, "models/" if path is None else f"{path.strip('/')}/".lstrip("/"), said, extents)


def _tar_files(registry, layers: list, prefix: str, said: str, extents: dict | None) -> list[ManifestFile]:
    for layer in layers:
        if not isinstance(layer.get("digest"), str) or not DIGEST.fullmatch(layer["digest"]):
            raise InvalidManifest(f"{said}: a layer is not addressed by a sha256 digest")
    files, others = oci_layers.flatten([oci_layers.scan(registry, layer, said) for layer in layers])
    chosen = oci_layers.selected(files, others, prefix, said)
    if extents is not None:
        extents.update({p: _extent(e) for p, (_, e) in chosen.items()})
    return [file for file, _ in chosen.values()]


def _extent(entry: oci_layers.Entry) -> dict:
    """Where a node finds a file of a tar layer (the ticket's ``extents``): ``encoding`` only when compressed."""
    out = {"blob": entry.blob, "offset": entry.offset, "size": entry.blob_size}
    return out | ({"encoding": entry.encoding} if entry.encoding else {})


def _layer_file(layer: dict, prefix: str, said: str) -> list[ManifestFile]:
    annotations = layer.get("annotations") if isinstance(layer, dict) else None
    if not isinstance(annotations, dict):
        raise InvalidManifest(f"{said}: a layer has no annotations naming its file")
    name = annotations.get(FILEPATH) or annotations.get(TITLE)
    media_type = str(layer.get("mediaType") or "")
    if not isinstance(name, str) or not name:
        raise InvalidManifest(f"{said}: a layer ({media_type}) has no {TITLE} annotation naming its file")
    if media_type.endswith(ARCHIVE_SUFFIXES):
        raise InvalidManifest(
            f"{said}: layer {name!r} is an archive ({media_type}); only file layers and tar layers (uncompressed,"
            " gzip or zstd) are supported"
        )
    digest, size = layer.get("digest"), layer.get("size")
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise InvalidManifest(f"{said}: layer {name!r} is not addressed by a sha256 digest")
    if isinstance(size, bool) or not isinstance(size, int):
        raise InvalidManifest(f"{said}: layer {name!r} has no integer size")
    name = name.lstrip("/")
    if prefix and not name.startswith(prefix):
        return []
    try:
        return [ManifestFile(name[len(prefix) :], size, "sha256", digest[7:])]
    except (InvalidPath, ValueError) as exc:
        raise InvalidManifest(f"{said}: layer {name!r}: {exc}") from None


def resolve(
    reference: str,
    *,
    path: str | None = None,
    credentials: Credentials | None = None,
    insecure_registries=(),
    platform: str = DEFAULT_PLATFORM,
    proxy: str | None = None,
    ca_bundle: str | None = None,
    timeout: float = 30.0,
) -> tuple[ResolvedRevision, str, str, dict]:
    """``(resolution, endpoint, repository, extents)``: the manifest digest the reference names now (the
    resolution's ``commit``), the files of the manifest it leads to, and where those inside tar layers are
    (``{path: {"blob", "offset", "size"}}``, and ``"encoding"`` for a gzip or zstd layer)."""
    ref = Reference.parse(reference)
    base = endpoint(ref.registry, insecure_registries)
    registry = Registry(base, ref.repository, credentials, proxy=proxy, ca_bundle=ca_bundle, timeout=timeout)
    _, top, manifest = fetch_manifest(registry, ref.asked, reference)
    if manifest.get("mediaType") in INDEXES or "manifests" in manifest:
        chosen = pick_platform(manifest, platform, reference)
        if not DIGEST.fullmatch(chosen):
            raise InvalidManifest(f"{reference}: the index names a manifest without a sha256 digest")
        _, _, manifest = fetch_manifest(registry, chosen, f"{reference} ({platform})")
    extents: dict = {}
    if is_image(manifest):
        files = image_files(registry, manifest, path, reference, extents)
    else:
        files = artifact_files(manifest, path, reference, registry, extents)
    return ResolvedRevision(top, files, revision=ref.tag), base, ref.repository, extents


def _config_host(key: str) -> str:
    """The ``host[:port]`` of a Docker config's ``auths`` key (``https://host/v1/`` as well as ``host``)."""
    key = key.strip()
    netloc = urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]
    netloc = netloc.lower()
    return DOCKER_HUB if netloc in DOCKER_HUB_ALIASES else netloc


def credentials_for(config: dict, registry: str) -> Credentials | None:
    """The credentials a ``.dockerconfigjson`` holds for ``registry`` (``auth``, else ``username`` and
    ``password``); ``None`` when it names the registry nowhere. ``ValueError`` on a malformed entry."""
    auths = config.get("auths") if isinstance(config, dict) else None
    if not isinstance(auths, dict):
        raise ValueError("it has no 'auths' object")
    registry = DOCKER_HUB if registry.lower() in DOCKER_HUB_ALIASES else registry.lower()
    for key, entry in auths.items():
        if not isinstance(key, str) or _config_host(key) != registry or not isinstance(entry, dict):
            continue
        if entry.get("auth"):
            try:
                username, sep, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except (TypeError, ValueError, UnicodeDecodeError):
                raise ValueError(f"the 'auth' of {key!r} is not base64 of user:password") from None
            if not sep:
                raise ValueError(f"the 'auth' of {key!r} is not base64 of user:password")
            return Credentials(username, password)
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            return Credentials(entry["username"], entry["password"])
    return None
