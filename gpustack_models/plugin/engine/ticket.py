"""The fetch ticket: everything a node needs to download one manifest digest from a hub.

The API hands a node a ticket for a digest it resolved: the hub (source and endpoint), the
repository at its commit, the manifest's files with their checksums, and the credentials and
network settings to use (token, proxy, CA bundle). The ticket's files must hash to its digest
(``validate``), so a node never downloads content other than what the digest names.

How each source turns a file into a download URL:

- Hugging Face: ``GET {endpoint}/{repository}/resolve/{commit}/{path}``; LFS files answer 302 to a
  CDN, which is followed (without the ``Authorization`` header, which goes to the hub's origin only).
- ModelScope: ``GET {endpoint}/api/v1/models/{repository}/repo?Revision={commit}&FilePath={path}``
  (as the ``modelscope`` client builds it), redirects followed the same way.
- An OCI registry: ``GET {endpoint}/v2/{repository}/blobs/sha256:{sha256 of the file}`` (each file is one
  layer of the artifact; ``commit`` is the manifest digest the reference was pinned to), or, for a file
  inside a tar layer (``extents``), the layer's blob: by range at the file's offset when the layer is
  uncompressed, from its start and decompressed (``plugin.engine.layers``) when it is gzip or zstd. The token is the
  registry credential ``base64(user:password)``, never sent as it is: the fetcher answers the registry's
  ``WWW-Authenticate`` challenge with it (``registry_auth``).
- S3-compatible storage: each file's own ``links`` entry, a GET of its object version pre-signed by the API
  (the node gets no key of the store); ``repository`` is the bucket, ``commit`` the digest of the listing
  pinned at resolution. Every link must be on the endpoint's origin.

A ticket may offer several *sources* of the same files (``HubSource``: the source, endpoint, repository,
commit and token of each tenant's artifact with this digest), in the order to try them; the first is
also the ticket's own ``source``/``endpoint``/``repository``/``commit``/``token``. The files'
checksums are the same whichever source serves them, so bytes verified from one are kept when the
next one takes over.

A ticket also lists *peers* (``PeerSource``): other nodes' plugins holding the digest ``Ready`` or
downloading it, whose peer endpoints (``peers``) serve the manifest's bytes; the API lists them in
``peers`` (``[{"node", "url", "state"}]``), ``Ready`` ones first; and ``joining``, how many more nodes
are to start on the digest that the peers cannot list yet (it is placed there, or their plugin is Ready, a
moment from now; ``None``: the API did not say).

Tokens are secrets: never written to disk and never in a ``repr`` or a message.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

from gpustack_models.kinds.oci_reference import DIGEST, REPOSITORY
from gpustack_models.plugin.engine.failures import INVALID_REQUEST, DownloadFailed
from gpustack_models.plugin.engine.ticket_peers import PEER_STATES, PeerSource, usable_peers  # noqa: F401 (re-exported)
from gpustack_models.sources.layer_encoding import ENCODINGS
from gpustack_models.sources.manifest import InvalidPath, ManifestFile, manifest_digest

HUGGING_FACE = "huggingFace"
MODEL_SCOPE = "modelScope"
OCI = "oci"
S3 = "s3"
SOURCES = (HUGGING_FACE, MODEL_SCOPE, OCI, S3)
BY_SHA256 = (MODEL_SCOPE, OCI, S3)  # sources whose files are identified by their sha256

Source = Literal["huggingFace", "modelScope", "oci", "s3"]
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")

DIGEST_PATTERN = re.compile(r"sha256:([0-9a-f]{64})")
_REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_COMMIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TOKEN = re.compile(r"[\x21-\x7e]{1,4096}")  # printable ASCII, no space: safe in a header and a cookie


def digest_hex(digest: str) -> str:
    """The 64 hex characters of ``sha256:<hex>``; ``ValueError`` for anything else (so a digest can
    safely name a directory)."""
    m = DIGEST_PATTERN.fullmatch(digest) if isinstance(digest, str) else None
    if m is None:
        raise ValueError(f"not a manifest digest: {digest!r}")
    return m.group(1)


def redact_url(url: str | None) -> str | None:
    """``url`` without a password in its user info (for proxies given as ``http://user:pass@host``)."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def origin(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of an absolute http(s) URL, the port made explicit."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port


@dataclass(frozen=True, repr=False)
class HubSource:
    """Where a ticket's files can be fetched: ``repository`` at ``commit`` on the hub at ``endpoint``,
    with ``token`` as the bearer token (or ``None``)."""

    source: Source
    endpoint: str
    repository: str
    commit: str
    token: str | None = None
    links: tuple[tuple[str, str], ...] = ()  # an S3 source's (path, pre-signed URL) of each file
    # A registry source's files inside a tar layer: (path, layer digest, offset, layer size, encoding); the
    # offset is in the tar stream, the layer decompressed when the encoding is "gzip" or "zstd" ("": none).
    extents: tuple[tuple[str, str, int, int, str], ...] = ()

    def __post_init__(self):
        if isinstance(self.endpoint, str):
            object.__setattr__(self, "endpoint", self.endpoint.rstrip("/"))
        if isinstance(self.links, Mapping):
            object.__setattr__(self, "links", tuple(sorted(self.links.items())))
        object.__setattr__(self, "extents", _extents(self.extents))

    def __repr__(self) -> str:
        return (
            f"HubSource(source={self.source!r}, endpoint={self.endpoint!r}, repository={self.repository!r},"
            f" commit={self.commit!r}, token={'<redacted>' if self.token else None})"
        )

    __str__ = __repr__

    @property
    def key(self) -> tuple:
        """What makes two sources the same, with a fingerprint of the token rather than the token."""
        token = self.token
        fingerprint = hashlib.sha256(token.encode()).hexdigest()[:16] if isinstance(token, str) else None
        if self.links or self.extents:
            fingerprint = hashlib.sha256(repr((self.links, self.extents, fingerprint)).encode()).hexdigest()[:16]
        return (self.source, self.endpoint, self.repository, self.commit, fingerprint)

    # ---------------------------------------------------------------- validation

    def check(self) -> None:
        """Raise ``DownloadFailed(InvalidRequest)`` unless the source is usable. Messages go to the
        node's status, which names no repository: values other than the source kind are not quoted."""
        if self.source not in SOURCES:
            raise _invalid(f"source must be one of {', '.join(SOURCES)}, not {self.source!r}")
        endpoint = urlsplit(self.endpoint) if isinstance(self.endpoint, str) else None
        if endpoint is None or endpoint.scheme not in ("http", "https") or not endpoint.hostname:
            raise _invalid(f"endpoint must be an http(s) URL, not {self.endpoint!r}")
        if endpoint.query or endpoint.fragment or endpoint.username:
            raise _invalid("endpoint must not carry a query, fragment or credentials")
        {OCI: self._check_oci, S3: self._check_s3}.get(self.source, self._check_hub)()

    def _check_hub(self) -> None:
        if not isinstance(self.repository, str) or not _REPOSITORY.fullmatch(self.repository):
            raise _invalid("the repository is not a valid owner/name")
        if self.source == MODEL_SCOPE and "/" not in self.repository:
            raise _invalid("a ModelScope repository is owner/name")
        if ".." in self.repository:
            raise _invalid("the repository has a '..'")
        if not isinstance(self.commit, str) or not _COMMIT.fullmatch(self.commit):
            raise _invalid("the commit is not a revision id")
        if self.token is not None and not (isinstance(self.token, str) and _TOKEN.fullmatch(self.token)):
            raise _invalid("token must be a non-empty string of printable ASCII without spaces")

    def _check_oci(self) -> None:
        repository = self.repository if isinstance(self.repository, str) and len(self.repository) <= 255 else ""
        if not REPOSITORY.fullmatch(repository):
            raise _invalid("the repository is not a registry repository path")
        if not isinstance(self.commit, str) or not DIGEST.fullmatch(self.commit):
            raise _invalid("the commit of a registry source is its manifest's sha256 digest")
        if self.token is not None and not (isinstance(self.token, str) and _TOKEN.fullmatch(self.token)):
            raise _invalid("token must be a non-empty string of printable ASCII without spaces")
        for path, blob, offset, size, encoding in self.extents:
            valid = isinstance(path, str) and isinstance(blob, str) and DIGEST.fullmatch(blob)
            if not valid or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (offset, size)):
                raise _invalid("a registry source's extents must be a layer digest, an offset and a size by path")
            if encoding not in ENCODINGS:
                raise _invalid(f"a layer's encoding must be one of gzip, zstd or none, not {encoding!r}")

    def _check_s3(self) -> None:
        if not isinstance(self.repository, str) or not _BUCKET.fullmatch(self.repository):
            raise _invalid("the repository of an S3 source is not a bucket name")
        if not isinstance(self.commit, str) or not DIGEST.fullmatch(self.commit):
            raise _invalid("the commit of an S3 source is the digest of its listing")
        if self.token is not None:
            raise _invalid("an S3 source carries no token: its links are pre-signed")
        try:
            home = origin(self.endpoint)
            for path, link in self.links:
                parts = urlsplit(link) if isinstance(path, str) and isinstance(link, str) else None
                if parts is None or parts.scheme not in ("http", "https"):
                    raise _invalid("an S3 source's links must be http(s) URLs by file path")
                if origin(link) != home or parts.username is not None or parts.password is not None:
                    raise _invalid("an S3 source's links must be on its endpoint's origin")
        except ValueError:  # a port that is not one
            raise _invalid("an S3 source's endpoint or links have an invalid port") from None

    # ---------------------------------------------------------------- the hub's protocol

    def url(self, file: ManifestFile) -> str:
        """Where ``file``'s bytes are, on the hub (a redirect may follow)."""
        if self.source == S3:
            return dict(self.links)[file.path]
        if self.source == OCI:
            blob = next((e[1] for e in self.extents if e[0] == file.path), f"sha256:{file.hexdigest}")
            return f"{self.endpoint}/v2/{self.repository}/blobs/{blob}"
        if self.source == HUGGING_FACE:
            return f"{self.endpoint}/{self.repository}/resolve/{quote(self.commit, safe='')}/{quote(file.path)}"
        return (
            f"{self.endpoint}/api/v1/models/{self.repository}/repo"
            f"?Revision={quote_plus(self.commit)}&FilePath={quote_plus(file.path)}"
        )

    def extent(self, file: ManifestFile) -> tuple[int, int]:
        """``(offset, size)`` of the blob ``url`` names that holds ``file``'s bytes from ``offset`` on: a
        file inside a tar layer; else ``(0, file.size)``, the file itself."""
        return next(((e[2], e[3]) for e in self.extents if e[0] == file.path and not e[4]), (0, file.size))

    def packed(self, file: ManifestFile) -> tuple[str, int, int, str] | None:
        """``(layer digest, offset in its decompressed tar stream, layer size, encoding)`` of a file inside a
        compressed layer (which cannot be fetched by range: the layer is read from its start); else ``None``."""
        return next(((e[1], e[2], e[3], e[4]) for e in self.extents if e[0] == file.path and e[4]), None)

    def hub_headers(self) -> dict[str, str]:
        """Headers for requests to the hub's own origin (credentials); never sent elsewhere. None for a
        registry: its credential answers its challenge (``registry_auth``)."""
        if not self.token or self.source == OCI:
            return {}
        headers = {"Authorization": f"Bearer {self.token}"}
        if self.source == MODEL_SCOPE:
            # The ModelScope API authenticates downloads by its session cookie as well.
            headers["Cookie"] = f"m_session_id={self.token}"
        return headers

    # ---------------------------------------------------------------- wire format

    def to_dict(self, *, include_token: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "endpoint": self.endpoint,
            "repository": self.repository,
            "commit": self.commit,
        }
        if include_token:
            out["token"] = self.token
        if self.links:
            out["links"] = dict(self.links)
        if self.extents:
            out["extents"] = {
                p: {"blob": b, "offset": o, "size": n, **({"encoding": e} if e else {})}
                for p, b, o, n, e in self.extents
            }
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, token: str | None = None) -> HubSource:
        """Build from ``to_dict``'s form (``revision`` is read for ``commit`` too); ``token``, if
        given, wins over the form's. Raises what a malformed form raises (``KeyError``, ``TypeError``...)."""
        return cls(
            source=data["source"],
            endpoint=data["endpoint"],
            repository=data["repository"],
            commit=data.get("commit") or data.get("revision"),
            token=token if token is not None else data.get("token"),
            links=dict(data.get("links") or {}),
            extents=dict(data.get("extents") or {}),
        )


@dataclass(frozen=True, repr=False)
class FetchTicket:
    """One digest to download: ``files`` must be exactly the manifest that ``digest`` names.

    ``source``, ``endpoint``, ``repository``, ``commit`` and ``token`` are the first source to try
    (``endpoint`` the hub's base URL, a mirror's too; ``commit`` the resolved revision; ``token`` a
    bearer token for the hub, or ``None``); ``fallbacks`` the further sources, in order (see
    ``sources``). ``proxy`` is an ``http://`` proxy URL used for both schemes (HTTPS through
    ``CONNECT``; or ``None`` for direct connections: the process environment is never consulted),
    ``ca_bundle`` a PEM file replacing the default trust store (or ``None`` for the bundled default).
    """

    digest: str
    source: Source
    endpoint: str
    repository: str
    commit: str
    files: tuple[ManifestFile, ...]
    token: str | None = field(default=None)
    proxy: str | None = None
    ca_bundle: str | None = None
    fallbacks: tuple[HubSource, ...] = ()
    peers: tuple[PeerSource, ...] = ()
    joining: int | None = None
    links: tuple[tuple[str, str], ...] = ()  # the first source's, when it is an S3 source
    extents: tuple[tuple[str, str, int, int, str], ...] = ()  # the first source's, when it is a registry source

    def __post_init__(self):
        object.__setattr__(self, "files", tuple(self.files))
        if isinstance(self.links, Mapping):
            object.__setattr__(self, "links", tuple(sorted(self.links.items())))
        object.__setattr__(self, "extents", _extents(self.extents))
        object.__setattr__(self, "fallbacks", tuple(self.fallbacks))
        object.__setattr__(self, "peers", tuple(self.peers))
        if isinstance(self.endpoint, str):
            object.__setattr__(self, "endpoint", self.endpoint.rstrip("/"))

    # ---------------------------------------------------------------- identity and secrecy

    @property
    def hex(self) -> str:
        return digest_hex(self.digest)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def primary(self) -> HubSource:
        """The first source: the ticket's own fields."""
        return HubSource(self.source, self.endpoint, self.repository, self.commit, self.token, self.links, self.extents)

    @property
    def sources(self) -> tuple[HubSource, ...]:
        """Every source, in the order to try them, each once (the same endpoint, repository, commit
        and token)."""
        seen: set[tuple] = set()
        out = []
        for hub in (self.primary, *self.fallbacks):
            if hub.key not in seen:
                seen.add(hub.key)
                out.append(hub)
        return tuple(out)

    def __repr__(self) -> str:
        fallbacks = f", fallbacks={list(self.fallbacks)!r}" if self.fallbacks else ""
        fallbacks += f", peers={[p.node for p in self.peers]!r}" if self.peers else ""
        return (
            f"FetchTicket(digest={self.digest!r}, source={self.source!r}, endpoint={self.endpoint!r},"
            f" repository={self.repository!r}, commit={self.commit!r}, files=<{len(self.files)} files,"
            f" {self.size} bytes>, token={'<redacted>' if self.token else None},"
            f" proxy={redact_url(self.proxy)!r}, ca_bundle={self.ca_bundle!r}{fallbacks})"
        )

    __str__ = __repr__

    # ---------------------------------------------------------------- validation

    def validate(self) -> FetchTicket:
        """Return self if the ticket is usable, else raise ``DownloadFailed(InvalidRequest)``: the
        digest, every source (each checked as strictly as the first), the connection settings, and
        the files, which must hash to the digest."""
        try:
            digest_hex(self.digest)
        except ValueError:
            raise _invalid(f"digest must be sha256:<64 lowercase hex>, not {self.digest!r}") from None
        for hub in (self.primary, *self.fallbacks):
            if not isinstance(hub, HubSource):
                raise _invalid(f"sources must be HubSource, not {type(hub).__name__}")
            hub.check()
        for peer in self.peers:
            if not isinstance(peer, PeerSource):
                raise _invalid(f"peers must be PeerSource, not {type(peer).__name__}")
            peer.check()
        self._check_connection()
        self._check_files()
        actual = manifest_digest(self.files)
        if actual != self.digest:
            raise _invalid(f"the files hash to {actual}, not to the ticket's digest {self.digest}")
        return self

    def _check_connection(self) -> None:
        """The proxy and the CA bundle."""
        if self.proxy is not None:
            proxy = urlsplit(self.proxy) if isinstance(self.proxy, str) else None
            if proxy is None or proxy.scheme != "http" or not proxy.hostname:
                raise _invalid(f"proxy must be an http:// URL, not {redact_url(str(self.proxy))!r}")
        if self.ca_bundle is not None and not (isinstance(self.ca_bundle, str) and os.path.isfile(self.ca_bundle)):
            raise _invalid(f"CA bundle {self.ca_bundle!r} is not a readable file")

    def _check_files(self) -> None:
        """At least one file, each a ``ManifestFile`` at its own path, none also a directory."""
        if not self.files:
            raise _invalid("the manifest has no file")
        paths: set[str] = set()
        for f in self.files:
            if not isinstance(f, ManifestFile):
                raise _invalid(f"file entries must be ManifestFile, not {type(f).__name__}")
            if f.path in paths:
                raise _invalid(f"file {f.path!r} appears twice")
            paths.add(f.path)
        for path in paths:
            parts = path.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in paths:
                    raise _invalid(f"{'/'.join(parts[:i])!r} is both a file and a directory")
        self._check_sources_files(paths)

    def _check_sources_files(self, paths: set[str]) -> None:
        """What a source needs of the files: a sha256 each (all but Hugging Face), a link each (S3)."""
        by_sha256 = [hub.source for hub in self.sources if hub.source in BY_SHA256]
        if by_sha256 and any(f.algorithm != "sha256" for f in self.files):
            named = {MODEL_SCOPE: "ModelScope", OCI: "registry", S3: "S3"}[by_sha256[0]]
            raise _invalid(f"{named} files are identified by sha256")
        for hub in self.sources:
            if hub.source == S3 and not paths <= dict(hub.links).keys():
                raise _invalid("an S3 source has no link for some of the files")

    # ---------------------------------------------------------------- the hub's protocol (first source)

    def url(self, file: ManifestFile) -> str:
        """Where ``file``'s bytes are, on the first source's hub (a redirect may follow)."""
        return self.primary.url(file)

    def hub_headers(self) -> dict[str, str]:
        """The first source's credentials, for its hub's origin only."""
        return self.primary.hub_headers()

    # ---------------------------------------------------------------- wire format

    def to_dict(self, *, include_token: bool = False) -> dict[str, Any]:
        """A JSON-able form (camelCase, as a ticket travels); tokens only if asked for. The first
        source is at the top level (what a reader of single-source tickets reads) and first in
        ``sources``."""
        return {
            "digest": self.digest,
            **self.primary.to_dict(include_token=include_token),
            "files": [
                {"path": f.path, "size": f.size, "algorithm": f.algorithm, "hexdigest": f.hexdigest, "lfs": f.lfs}
                for f in self.files
            ],
            "proxy": self.proxy,
            "caBundle": self.ca_bundle,
            "sources": [hub.to_dict(include_token=include_token) for hub in self.sources],
            "peers": [peer.to_dict() for peer in self.peers],
            **({"joining": self.joining} if self.joining is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, token: str | None = None) -> FetchTicket:
        """Build from ``to_dict``'s form: the sources from ``sources`` if present, else the one at the
        top level. A file may give ``checksum: "<alg>:<hex>"`` instead of ``algorithm`` and
        ``hexdigest``. ``token``, if given, is the first source's. Raises
        ``DownloadFailed(InvalidRequest)`` on a malformed entry (call ``validate()`` for the full check)."""
        try:
            files = [_file_from_dict(item) for item in data.get("files") or ()]
            listed = [HubSource.from_dict(item) for item in data.get("sources") or ()]
            first = listed[0] if listed else HubSource.from_dict(data)
            return cls(
                digest=data["digest"],
                source=first.source,
                endpoint=first.endpoint,
                repository=first.repository,
                commit=first.commit,
                files=files,
                token=token if token is not None else first.token,
                links=first.links,
                extents=first.extents,
                proxy=data.get("proxy") or None,
                ca_bundle=data.get("caBundle") or data.get("ca_bundle") or None,
                fallbacks=listed[1:],
                peers=[PeerSource.from_dict(item) for item in data.get("peers") or ()],
                joining=_count(data.get("joining")),
            )
        except (KeyError, TypeError, ValueError, InvalidPath, AttributeError) as exc:
            raise DownloadFailed(INVALID_REQUEST, f"invalid fetch ticket: {type(exc).__name__}: {exc}") from None


def _extents(value) -> tuple:
    """Extents given as ``{path: {"blob", "offset", "size", "encoding"}}`` (the wire's form), as sorted tuples."""
    if not isinstance(value, Mapping):
        return tuple(value)
    entries = (
        (p, e.get("blob"), e.get("offset"), e.get("size"), e.get("encoding", ""))
        for p, e in value.items()
        if isinstance(e, Mapping)
    )
    return tuple(sorted(entries, key=lambda e: str(e[0])))


def _count(value: Any) -> int | None:
    """A count the ticket may give (``joining``): a non-negative integer, else ``None`` (not said)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _invalid(message: str) -> DownloadFailed:
    return DownloadFailed(INVALID_REQUEST, f"invalid fetch ticket: {message}")


def _file_from_dict(item: Mapping[str, Any]) -> ManifestFile:
    algorithm, hexdigest = item.get("algorithm"), item.get("hexdigest")
    if algorithm is None and "checksum" in item:
        algorithm, _, hexdigest = str(item["checksum"]).partition(":")
    return ManifestFile(item["path"], item["size"], algorithm, hexdigest, bool(item.get("lfs", False)))


def ticket_files(files: Iterable[ManifestFile]) -> list[ManifestFile]:
    """The files in manifest order (by the path's UTF-8 bytes)."""
    return sorted(files, key=lambda f: f.path.encode("utf-8"))
