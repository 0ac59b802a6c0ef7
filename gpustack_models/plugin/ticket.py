"""The fetch ticket: everything a node needs to download one manifest digest from a hub.

The worker hands a node a ticket for a digest it resolved: the hub (source and endpoint), the
repository at its commit, the manifest's files with their checksums, and the credentials and
network settings to use (token, proxy, CA bundle). The ticket's files must hash to its digest
(``validate``), so a node never downloads content other than what the digest names.

How each source turns a file into a download URL:

- Hugging Face: ``GET {endpoint}/{repository}/resolve/{commit}/{path}``; LFS files answer 302 to a
  CDN, which is followed (without the ``Authorization`` header, which goes to the hub's origin only).
- ModelScope: ``GET {endpoint}/api/v1/models/{repository}/repo?Revision={commit}&FilePath={path}``
  (as the ``modelscope`` client builds it), redirects followed the same way.

The token is a secret: it is never written to disk and never appears in a ``repr`` or a message.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

from gpustack_models.sources.manifest import InvalidPath, ManifestFile, manifest_digest

from .failures import INVALID_REQUEST, DownloadFailed

HUGGING_FACE = "huggingFace"
MODEL_SCOPE = "modelScope"
SOURCES = (HUGGING_FACE, MODEL_SCOPE)

Source = Literal["huggingFace", "modelScope"]

DIGEST_PATTERN = re.compile(r"sha256:([0-9a-f]{64})")
_REPOSITORY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_COMMIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


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
class FetchTicket:
    """One digest to download: ``files`` must be exactly the manifest that ``digest`` names.

    ``endpoint`` is the hub's base URL (a mirror's too), ``commit`` the resolved revision,
    ``token`` a bearer token for the hub (or ``None``), ``proxy`` an ``http://`` proxy URL used for
    both schemes (HTTPS through ``CONNECT``; or ``None`` for direct connections: the process
    environment is never consulted), ``ca_bundle`` a PEM file replacing the default trust store (or
    ``None`` for the bundled default).
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

    def __post_init__(self):
        object.__setattr__(self, "files", tuple(self.files))
        if isinstance(self.endpoint, str):
            object.__setattr__(self, "endpoint", self.endpoint.rstrip("/"))

    # ---------------------------------------------------------------- identity and secrecy

    @property
    def hex(self) -> str:
        return digest_hex(self.digest)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def __repr__(self) -> str:
        return (
            f"FetchTicket(digest={self.digest!r}, source={self.source!r}, endpoint={self.endpoint!r},"
            f" repository={self.repository!r}, commit={self.commit!r}, files=<{len(self.files)} files,"
            f" {self.size} bytes>, token={'<redacted>' if self.token else None},"
            f" proxy={redact_url(self.proxy)!r}, ca_bundle={self.ca_bundle!r})"
        )

    __str__ = __repr__

    # ---------------------------------------------------------------- validation

    def validate(self) -> FetchTicket:
        """Return self if the ticket is usable, else raise ``DownloadFailed(InvalidRequest)``."""
        self._check_hub()
        self._check_revision()
        self._check_connection()
        self._check_files()
        actual = manifest_digest(self.files)
        if actual != self.digest:
            raise _invalid(f"the files hash to {actual}, not to the ticket's digest {self.digest}")
        return self

    def _check_hub(self) -> None:
        """The digest, the source and the endpoint."""
        try:
            digest_hex(self.digest)
        except ValueError:
            raise _invalid(f"digest must be sha256:<64 lowercase hex>, not {self.digest!r}") from None
        if self.source not in SOURCES:
            raise _invalid(f"source must be one of {', '.join(SOURCES)}, not {self.source!r}")
        endpoint = urlsplit(self.endpoint) if isinstance(self.endpoint, str) else None
        if endpoint is None or endpoint.scheme not in ("http", "https") or not endpoint.hostname:
            raise _invalid(f"endpoint must be an http(s) URL, not {self.endpoint!r}")
        if endpoint.query or endpoint.fragment or endpoint.username:
            raise _invalid("endpoint must not carry a query, fragment or credentials")

    def _check_revision(self) -> None:
        """The repository and the commit. Messages go to the node's status, which names no
        repository: values are not quoted."""
        if not isinstance(self.repository, str) or not _REPOSITORY.fullmatch(self.repository):
            raise _invalid("the repository is not a valid owner/name")
        if self.source == MODEL_SCOPE and "/" not in self.repository:
            raise _invalid("a ModelScope repository is owner/name")
        if ".." in self.repository:
            raise _invalid("the repository has a '..'")
        if not isinstance(self.commit, str) or not _COMMIT.fullmatch(self.commit):
            raise _invalid("the commit is not a revision id")

    def _check_connection(self) -> None:
        """The proxy, the CA bundle and the token."""
        if self.proxy is not None:
            proxy = urlsplit(self.proxy) if isinstance(self.proxy, str) else None
            if proxy is None or proxy.scheme != "http" or not proxy.hostname:
                raise _invalid(f"proxy must be an http:// URL, not {redact_url(str(self.proxy))!r}")
        if self.ca_bundle is not None and not (isinstance(self.ca_bundle, str) and os.path.isfile(self.ca_bundle)):
            raise _invalid(f"CA bundle {self.ca_bundle!r} is not a readable file")
        if self.token is not None and (not isinstance(self.token, str) or not self.token or "\n" in self.token):
            raise _invalid("token must be a non-empty single-line string")

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
        if self.source == MODEL_SCOPE and any(f.algorithm != "sha256" for f in self.files):
            raise _invalid("ModelScope files are identified by sha256")

    # ---------------------------------------------------------------- the hub's protocol

    def url(self, file: ManifestFile) -> str:
        """Where ``file``'s bytes are, on the hub (a redirect may follow)."""
        if self.source == HUGGING_FACE:
            return f"{self.endpoint}/{self.repository}/resolve/{quote(self.commit, safe='')}/{quote(file.path)}"
        return (
            f"{self.endpoint}/api/v1/models/{self.repository}/repo"
            f"?Revision={quote_plus(self.commit)}&FilePath={quote_plus(file.path)}"
        )

    def hub_headers(self) -> dict[str, str]:
        """Headers for requests to the hub's own origin (credentials); never sent elsewhere."""
        if not self.token:
            return {}
        headers = {"Authorization": f"Bearer {self.token}"}
        if self.source == MODEL_SCOPE:
            # The ModelScope API authenticates downloads by its session cookie as well.
            headers["Cookie"] = f"m_session_id={self.token}"
        return headers

    # ---------------------------------------------------------------- wire format

    def to_dict(self, *, include_token: bool = False) -> dict[str, Any]:
        """A JSON-able form (camelCase, as a ticket travels); the token only if asked for."""
        out: dict[str, Any] = {
            "digest": self.digest,
            "source": self.source,
            "endpoint": self.endpoint,
            "repository": self.repository,
            "commit": self.commit,
            "files": [
                {"path": f.path, "size": f.size, "algorithm": f.algorithm, "hexdigest": f.hexdigest, "lfs": f.lfs}
                for f in self.files
            ],
            "proxy": self.proxy,
            "caBundle": self.ca_bundle,
        }
        if include_token:
            out["token"] = self.token
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, token: str | None = None) -> FetchTicket:
        """Build from ``to_dict``'s form. A file may give ``checksum: "<alg>:<hex>"`` instead of
        ``algorithm`` and ``hexdigest``. Raises ``DownloadFailed(InvalidRequest)`` on a malformed
        entry (call ``validate()`` for the full check)."""
        try:
            files = [_file_from_dict(item) for item in data.get("files") or ()]
            return cls(
                digest=data["digest"],
                source=data["source"],
                endpoint=data["endpoint"],
                repository=data["repository"],
                commit=data.get("commit") or data.get("revision"),
                files=files,
                token=token if token is not None else data.get("token"),
                proxy=data.get("proxy") or None,
                ca_bundle=data.get("caBundle") or data.get("ca_bundle") or None,
            )
        except (KeyError, TypeError, ValueError, InvalidPath, AttributeError) as exc:
            raise DownloadFailed(INVALID_REQUEST, f"invalid fetch ticket: {type(exc).__name__}: {exc}") from None


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
