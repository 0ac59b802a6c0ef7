"""A fake Hugging Face + ModelScope hub on 127.0.0.1, spoken to by the real clients in tests.

One HTTP/1.1 server (keep-alive, exact ``Content-Length`` on every answer) serves both hubs' APIs;
a second listener on another loopback address plays the CDN that LFS downloads are redirected to.
Repositories are generated in memory (or point at files on disk, for benchmarks) by the test::

    with FakeHub() as hub:  # or the ``fakehub`` fixture of ``tests.fakehub.fixtures``
        commit = hub.add_hf_repo("org/model", {"config.json": b"{}", "model.safetensors": weights})
        hub.add_hf_commit("org/model", {"config.json": b'{"v": 2}'})        # main moves on
        hub.add_hf_repo("org/xet", files, xet=True)                         # LFS files Xet-backed
        hub.add_ms_repo("owner/model", files, revision="master", tags=("v1.0",))
        hub.set_private("org/model"); hub.delete_repo("org/xet")          # a repository goes away
        hub.files("org/model", commit)                                     # the exact bytes served
        hub.faults.drop("model.safetensors", after_bytes=1 << 20)          # once, mid-file
        held = hub.faults.pause("model.safetensors", after_bytes=1 << 20)  # 1 MiB, then held...
        held.wait_held(); held.release()                                   # ...until the test lets it go
        hub.requests                                                       # what the clients asked

``hub.url`` is both the Hugging Face endpoint and ``MODELSCOPE_ENDPOINT``.

Hugging Face (what ``huggingface_hub`` 2.x sends, see ``HfApi`` / ``hf_hub_download``):

- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}``: model info; ``sha`` is the
  commit the branch, tag or full commit id points at; ``siblings`` (with sizes when ``blobs=true``).
- ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=&expand=``: ``{type, oid, size, path,
  lfs: {oid, size, pointerSize}, xetHash}`` entries (``type`` ``file`` or ``directory``; ``lfs`` for
  LFS files, ``xetHash`` for Xet-backed ones), ``page_size`` per page, the next page in
  ``Link: <...>; rel="next"`` (opaque ``cursor``).
- ``GET /api/models/{repo}/refs``, ``GET /api/models/{repo}/auth-check``.
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (git blob id), ``Range``
  -> 206; LFS files answer 302 to the CDN with ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``;
  Xet-backed ones the same 302, plus ``X-Xet-Hash`` and ``Link: <.../xet-read-token/{commit}>;
  rel="xet-auth"``. There is no Xet storage service (no ``xet-read-token``, no CAS): a client fetches
  Xet files over HTTP through the redirect (the CDN honours ``Range``), as ``huggingface_hub`` does
  without ``hf_xet`` or with ``HF_HUB_DISABLE_XET`` (which the ``hub_env`` fixture sets).
- Errors with ``X-Error-Code`` / ``X-Error-Message`` and ``{"error": ...}``: ``RepoNotFound`` (401
  without a token, 404 with one) for unknown repositories and private ones the token may not read,
  ``RevisionNotFound``, ``EntryNotFound`` (404); a token the hub does not know gets 401 "Invalid
  credentials in Authorization header". Gated repositories answer model info and trees (200) but
  ``GatedRepo`` (401 without token, 403 with an ungranted one) on downloads and ``auth-check``.

ModelScope (what ``modelscope`` / ``modelscope_hub`` send, envelope ``{"Code": 200, "Data": ...,
"Message", "RequestId", "Success": true}``; errors carry the HTTP status as ``Code``):

- ``GET /api/v1/models/{owner}/{name}``: model info.
- ``GET /api/v1/models/{id}/revisions``: ``Data.RevisionMap.{Branches,Tags}[]`` of ``{Revision (the
  name), CreatedAt, CreatedBy, Description, Url}``; like the real API, no commit id.
- ``GET /api/v1/models/{id}/repo/files?Revision=&Recursive=True[&Root=dir]``: ``Data.Files`` entries
  ``{Path, Name, Type: blob|tree, Size, Sha256, IsLFS, Revision, CommitId, CommittedDate, ...}`` where
  ``Revision`` and ``CommitId`` name the commit that last changed the entry (as ``git log -1 -- path``
  would), ``CommittedDate`` its date; and ``Data.LatestCommitter`` (``Id`` = the commit the revision
  points at, ``ShortId`` its first 8 characters). Truncated, like the real API, at ``ms_page_size``
  entries, no pagination. ``ms_latest_committer`` and ``ms_file_commits`` leave commit ids out, as
  real answers sometimes do.
- ``GET``/``HEAD /api/v1/models/{id}/repo?Revision=&FilePath=``: the bytes, ``Range`` -> 206; LFS
  files 302 to the CDN (``ms_lfs_redirect``).
- Unknown repository 404, private without token 401, with an ungranted token 403. The OpenAPI
  surface (``/openapi/v1``) answers 404 ``ResourceNotFound``, so the client falls back to ``/api/v1``.
- The real API answers many errors with HTTP 200 and ``{"Code": <business code>, "Success": false}``:
  ``hub.faults.refuse(match, code)`` answers matching requests that way.

Faults (``hub.faults``) apply to matching requests a limited number of times; see ``Faults``.

Egress, for fan-out tests: ``hub.total_rate`` (bytes per second, 0: none) caps the file bodies of
all connections together (both listeners), as a hub rate-limiting a cluster's address would;
``hub.body_bytes`` counts the file body bytes handed to sockets since ``hub.reset_body_bytes()``.

Peer emulation: ``hub.serve_peer(hex, files, have=None, client=None)`` makes this server answer the
node plugin's peer endpoints for digest ``hex`` (``GET /peer/v1/trees/{hex}`` and
``GET /peer/v1/trees/{hex}/files/{path}`` with ``Range``; 416 outside ``have``, 401 unless the
connection's client certificate, verified against ``FakeHub(client_ca=...)``, is of the subject CN
``client`` when one is set), so several hubs at several speeds can play peers; faults apply to its
file bodies as to the hub's (``match`` on ``/peer/v1/...``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import itertools
import json
import os
import re
import secrets
import socket
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

CHUNK_SIZE = 256 * 1024
FileSource = bytes | bytearray | memoryview | os.PathLike | str


def git_blob_sha1(data: bytes) -> str:
    """The git blob id of ``data``: sha1 of ``b"blob <size>\\0" + data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The Git LFS pointer file that a repository stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


# --------------------------------------------------------------------------------------------------
# Repository model
# --------------------------------------------------------------------------------------------------


class Blob:
    """File content: in memory, or a file on disk (hashed once when added)."""

    __slots__ = ("size", "sha256", "gitsha1", "_data", "_path")

    def __init__(self, source: FileSource):
        self._data: bytes | None = None
        self._path: Path | None = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            self._data = data
            self.size = len(data)
            self.sha256 = hashlib.sha256(data).hexdigest()
            self.gitsha1 = git_blob_sha1(data)
        else:
            path = Path(source)
            size = path.stat().st_size
            sha256 = hashlib.sha256()
            sha1 = hashlib.sha1(b"blob %d\0" % size)
            with path.open("rb") as f:
                while chunk := f.read(4 * 1024 * 1024):
                    sha256.update(chunk)
                    sha1.update(chunk)
            self._path = path
            self.size = size
            self.sha256 = sha256.hexdigest()
            self.gitsha1 = sha1.hexdigest()

    def read(self) -> bytes:
        if self._data is not None:
            return self._data
        return self._path.read_bytes()

    def iter_range(self, start: int, stop: int, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
        """The bytes ``[start, stop)`` in chunks."""
        if self._data is not None:
            view = memoryview(self._data)
            for offset in range(start, stop, chunk_size):
                yield view[offset : min(stop, offset + chunk_size)]
            return
        with self._path.open("rb") as f:
            f.seek(start)
            remaining = stop - start
            while remaining > 0:
                chunk = f.read(min(chunk_size, remaining))
                if not chunk:
                    raise OSError(f"{self._path} shrank while being served")
                remaining -= len(chunk)
                yield chunk


@dataclass(frozen=True)
class FileRef:
    """A file of a commit: its content, whether the hub stores it in LFS and whether that LFS file is
    Xet-backed (stored in Xet storage; to git still an LFS pointer)."""

    blob: Blob
    lfs: bool
    xet: bool = False

    @property
    def git_oid(self) -> str:
        """The tree entry's ``oid``: the blob's git id, or the LFS pointer's for an LFS file."""
        if self.lfs:
            return git_blob_sha1(lfs_pointer(self.blob.sha256, self.blob.size))
        return self.blob.gitsha1

    @property
    def pointer_size(self) -> int:
        return len(lfs_pointer(self.blob.sha256, self.blob.size))

    @property
    def xet_hash(self) -> str | None:
        """The ``xetHash`` listed for a Xet-backed file, else None.

        The real hash is a Merkle hash of the content's chunks; this one only has its shape (64 hex
        characters, fixed by the content, unlike its sha256). Nothing served here is keyed by it.
        """
        if not self.xet:
            return None
        return hashlib.sha256(b"xet\0" + bytes.fromhex(self.blob.sha256)).hexdigest()


@dataclass
class Commit:
    id: str
    parent: str | None
    files: dict[str, FileRef]
    message: str
    date: datetime

    def directories(self) -> set[str]:
        dirs: set[str] = set()
        for path in self.files:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        return dirs


@dataclass
class Repo:
    kind: str  # "hf" or "ms"
    repo_id: str
    default_branch: str
    private: bool = False
    gated: bool = False
    xet: bool = False  # LFS files of its commits are Xet-backed
    tokens: set[str] = field(default_factory=set)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    created: datetime = field(default_factory=lambda: datetime.now(UTC))

    def last_change(self, commit: Commit, path: str) -> Commit:
        """The commit that last changed the file or directory ``path`` as ``commit`` has it: the oldest
        ancestor reached through commits that all hold the same content there."""
        if commit.parent is None:
            return commit
        prefix = f"{path}/"

        def content(c: Commit):
            ref = c.files.get(path)
            if ref is not None:
                return (ref.blob.sha256, ref.lfs)
            return sorted((p, r.blob.sha256, r.lfs) for p, r in c.files.items() if p.startswith(prefix))

        here = content(commit)
        while commit.parent is not None and content(self.commits[commit.parent]) == here:
            commit = self.commits[commit.parent]
        return commit

    def resolve(self, revision: str) -> Commit | None:
        if revision in self.branches:
            return self.commits[self.branches[revision]]
        if revision in self.tags:
            return self.commits[self.tags[revision]]
        return self.commits.get(revision.lower()) if re.fullmatch(r"[0-9a-fA-F]{40}", revision) else None


# --------------------------------------------------------------------------------------------------
# Request log and faults
# --------------------------------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    """One request as the hub saw it, logged when it arrives and completed in place.

    ``status`` and ``bytes_sent`` (body bytes handed to the socket) are final before the client can
    have read the whole answer; ``duration`` is set once the handler is done.
    """

    listener: str  # "hub" or "cdn"
    method: str
    path: str  # decoded path, no query
    query: dict[str, list[str]]
    range: str | None
    client: tuple[str, int]
    token: str | None
    host: str | None = None  # the Host header (through a proxy: the host the client asked for)
    status: int = 0  # 0: no answer (hang, dropped before the status line)
    bytes_sent: int = 0
    fault: str | None = None
    started: float = 0.0
    duration: float = 0.0

    @property
    def target(self) -> str:
        q = urlencode([(k, v) for k, values in self.query.items() for v in values])
        return self.path + (f"?{q}" if q else "")


@dataclass
class Fault:
    """One fault knob. ``times=None`` means every matching request; ``hits`` counts applications."""

    kind: str  # fail, hang, delay, refuse, drop, stall, pause, corrupt, throttle
    match: str | re.Pattern | None
    times: int | None
    method: str | None = None
    listener: str | None = None
    status: int = 503
    retry_after: float | None = None
    seconds: float | None = None
    after_bytes: int = 0
    offset: int | None = None
    bytes_per_second: int = 0
    code: int | str | None = None
    message: str | None = None
    hits: int = 0
    released: threading.Event = field(default_factory=threading.Event)  # ends a delay, a throttle or a pause early
    held: int = 0  # a pause: the bodies it holds now
    _held_changed: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def release(self) -> None:
        self.released.set()

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times

    def wait_held(self, count: int = 1, timeout: float = 30.0) -> int:
        """A pause: wait until it holds at least ``count`` bodies at once; return how many it holds, or
        raise ``TimeoutError`` after ``timeout`` seconds."""
        with self._held_changed:
            if not self._held_changed.wait_for(lambda: self.held >= count, timeout):
                raise TimeoutError(f"{self.held} of {count} bodies held by the pause on {self.match!r}")
            return self.held

    def _hold(self) -> None:
        """A pause: hold the calling body until released (``clear()`` and the hub's ``stop()`` release it
        too) or for ``seconds``."""
        with self._held_changed:
            self.held += 1
            self._held_changed.notify_all()
        try:
            self.released.wait(self.seconds)
        finally:
            with self._held_changed:
                self.held -= 1
                self._held_changed.notify_all()

    def matches(self, listener: str, method: str, target: str) -> bool:
        if self.exhausted:
            return False
        if self.kind == "pause" and self.released.is_set():
            return False
        if self.listener is not None and self.listener != listener:
            return False
        if self.method is not None and self.method.upper() != method:
            return False
        if self.match is None:
            return True
        if isinstance(self.match, re.Pattern):
            return self.match.search(target) is not None
        return self.match in target


class Faults:
    """Fault knobs, each limited to requests matching ``match`` and to ``times`` applications.

    ``match`` is a substring of, or a compiled regex searched in, the decoded request target
    (``/path?query``), for example ``"model.safetensors"`` or ``re.compile(r"/tree/")``; ``None``
    matches everything. ``method`` (``"GET"``/``"HEAD"``) and ``listener`` (``"hub"``/``"cdn"``)
    narrow it further.

    ``fail``, ``hang`` and ``delay`` apply to any matching request, ``refuse`` to matching requests to the
    ModelScope API. ``drop``, ``stall``, ``pause``, ``corrupt`` and ``throttle`` apply only to answers carrying
    file bytes (200/206 of a download, on the hub or the CDN), so a ``HEAD`` or a 302 on the way does
    not use them up. An LFS download of ``name`` matches on both: the CDN URL carries ``?filename=name``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def _add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def fail(
        self,
        match=None,
        status: int = 503,
        *,
        times: int | None = 1,
        retry_after: float | None = None,
        method: str | None = None,
        listener: str | None = None,
    ) -> Fault:
        """Answer ``status`` (500/502/503/429...) in the hub's error format. A 429 carries
        ``Retry-After`` (``retry_after``, default 1 second)."""
        if status == 429 and retry_after is None:
            retry_after = 1
        return self._add(Fault("fail", match, times, method, listener, status=status, retry_after=retry_after))

    def refuse(
        self,
        match=None,
        code: int | str = 404,
        message: str | None = None,
        *,
        times: int | None = 1,
        method: str | None = None,
    ) -> Fault:
        """ModelScope API only: answer HTTP 200 with a refusing envelope, ``{"Code": code, "Data": null,
        "Message": message, "RequestId": ..., "Success": false}``, as the real API answers many errors
        (an unknown or private repository, an unknown revision...) with a business code. One endpoint
        of repository ``id``: ``f"/api/v1/models/{id}/revisions"``, ``f"/api/v1/models/{id}/repo/files"``,
        or ``re.compile(rf"^/api/v1/models/{id}(\\?|$)")`` for the repository itself."""
        message = message or f"request refused (code {code})"
        return self._add(Fault("refuse", match, times, method, "hub", status=200, code=code, message=message))

    def hang(
        self, match=None, *, times: int | None = 1, seconds: float | None = None, method=None, listener=None
    ) -> Fault:
        """Read the request, then answer nothing for ``seconds`` (default: until the hub stops), then
        close the connection."""
        return self._add(Fault("hang", match, times, method, listener, seconds=seconds))

    def delay(self, match=None, seconds: float = 1.0, *, times: int | None = 1, method=None, listener=None) -> Fault:
        """Hold the request for ``seconds`` (or until ``release()`` of the returned fault), then answer it
        as usual."""
        return self._add(Fault("delay", match, times, method, listener, seconds=seconds))

    def drop(self, match=None, after_bytes: int = 0, *, times: int | None = 1, method=None, listener=None) -> Fault:
        """Send the headers and ``after_bytes`` body bytes of a file, then close the connection."""
        return self._add(Fault("drop", match, times, method, listener, after_bytes=after_bytes))

    def stall(
        self,
        match=None,
        after_bytes: int = 0,
        *,
        seconds: float | None = None,
        times: int | None = 1,
        method=None,
        listener=None,
    ) -> Fault:
        """Send the headers and ``after_bytes`` body bytes of a file, then nothing for ``seconds``
        (default: until the hub stops), then close the connection."""
        return self._add(Fault("stall", match, times, method, listener, seconds=seconds, after_bytes=after_bytes))

    def pause(
        self,
        match=None,
        after_bytes: int = 0,
        *,
        seconds: float | None = None,
        times: int | None = None,
        method=None,
        listener=None,
    ) -> Fault:
        """Send the headers and ``after_bytes`` body bytes of each file body it matches, then hold the body
        until ``release()`` of the returned fault (or for ``seconds``; ``clear()`` and the hub's ``stop()``
        release it too), then send the rest as usual: a download caught mid-way for as long as the test
        needs it there, without a rate to wait on. ``held`` counts the bodies held now; ``wait_held(n)``
        waits until ``n`` are held at once. Several pauses of one body hold it at each point in turn; a
        released pause matches nothing more."""
        return self._add(Fault("pause", match, times, method, listener, seconds=seconds, after_bytes=after_bytes))

    def corrupt(
        self, match=None, *, offset: int | None = None, times: int | None = 1, method=None, listener=None
    ) -> Fault:
        """Flip (xor 0xff) one byte of a file body: ``offset`` from the start of the body sent
        (default: its middle byte)."""
        return self._add(Fault("corrupt", match, times, method, listener, offset=offset))

    def throttle(
        self, match=None, bytes_per_second: int = 1024 * 1024, *, times: int | None = None, method=None, listener=None
    ) -> Fault:
        """Send file bodies at no more than ``bytes_per_second`` per connection (until ``release()`` of the
        returned fault: the bodies it throttles go on at full speed)."""
        if bytes_per_second <= 0:
            raise ValueError("bytes_per_second must be positive")
        return self._add(Fault("throttle", match, times, method, listener, bytes_per_second=bytes_per_second))

    def clear(self) -> None:
        """Remove every fault; the bodies a pause holds go on."""
        with self._lock:
            faults, self._faults = self._faults, []
        self._release_pauses(faults)

    @staticmethod
    def _release_pauses(faults: Iterable[Fault]) -> None:
        for fault in faults:
            if fault.kind == "pause":
                fault.release()

    def __iter__(self) -> Iterator[Fault]:
        with self._lock:
            return iter(list(self._faults))

    def _take(self, kinds: Iterable[str], listener: str, method: str, target: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.kind in kinds and fault.matches(listener, method, target):
                    fault.hits += 1
                    return fault
        return None

    def _take_all(self, kind: str, listener: str, method: str, target: str) -> list[Fault]:
        """Every fault of ``kind`` matching the request (each counts one hit)."""
        with self._lock:
            taken = [f for f in self._faults if f.kind == kind and f.matches(listener, method, target)]
            for fault in taken:
                fault.hits += 1
        return taken


# --------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, hub: FakeHub, listener: str, tls: ssl.SSLContext | None = None):
        self.hub = hub
        self.listener = listener
        super().__init__(address, _Handler)
        if tls is not None:
            # Handshake in the connection's own thread (see _Handler.setup), not in accept().
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (OSError, ssl.SSLError)):
            return  # a client gone, or refusing our certificate: part of the game
        super().handle_error(request, client_address)


class _Respond(Exception):
    """Raised to stop handling after an answer has been sent."""


def _iso(value: datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """``(start, stop)`` for a single satisfiable range, ``"unsatisfiable"``, or ``None`` (whole file)."""
    if not header:
        return None
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if not m or (m.group(1) == "" and m.group(2) == ""):
        return None  # several ranges or garbage: serve the whole file, as RFC 9110 allows
    first, last = m.group(1), m.group(2)
    if first == "":
        suffix = int(last)
        if suffix == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - suffix), size
    start = int(first)
    if start >= size:
        return "unsatisfiable"
    stop = size if last == "" else min(size, int(last) + 1)
    if stop <= start:
        return "unsatisfiable"
    return start, stop


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fakehub/1"
    sys_version = ""
    server: _Server

    # ---------------------------------------------------------------- plumbing

    def log_message(self, format, *args):
        pass

    def setup(self):
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()
        self.server.hub._connections_add(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.hub._connections_discard(self.connection)

    def do_GET(self):
        self._handle("GET")

    def do_HEAD(self):
        self._handle("HEAD")

    def _other(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self._handle(self.command)

    do_POST = do_PUT = do_DELETE = do_PATCH = _other

    def _client_name(self) -> str | None:
        """The subject CN of the client certificate the handshake verified (``None``: none)."""
        verified = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        names = [v for rdn in (verified or {}).get("subject", ()) for k, v in rdn if k == "commonName"]
        return names[0] if names else None

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        if auth.lower().startswith("bearer "):
            return auth[7:].strip() or None
        cookie = self.headers.get("Cookie") or ""
        m = re.search(r"(?:^|;\s*)m_session_id=([^;]+)", cookie)
        return m.group(1) if m else None

    def _handle(self, method: str):
        hub = self.server.hub
        split = urlsplit(self.path)
        self._raw_path = split.path
        self._query = parse_qs(split.query, keep_blank_values=True)
        self._method = method
        self._target = unquote(self.path)
        self._rec = RecordedRequest(
            listener=self.server.listener,
            method=method,
            path=unquote(split.path),
            query=self._query,
            range=self.headers.get("Range"),
            client=tuple(self.client_address[:2]),
            token=self._token(),
            host=self.headers.get("Host"),
            started=time.time(),
        )
        hub._record(self._rec)  # logged now, completed in place: final before the client has the answer
        t0 = time.monotonic()
        try:
            kinds = ("fail", "hang", "delay", "refuse") if self._is_ms() else ("fail", "hang", "delay")
            fault = hub.faults._take(kinds, self.server.listener, method, self._target)
            if fault is not None and fault.kind == "delay":
                self._rec.fault = fault.kind
                fault.released.wait(fault.seconds)
                fault = None
            if fault is not None:
                self._rec.fault = fault.kind
                if fault.kind == "hang":
                    hub._stopping.wait(fault.seconds)
                    self._abort()
                    return
                if fault.kind == "refuse":
                    self._ms_refuse(fault.code, fault.message)
                self._fail(fault)
                return
            if method not in ("GET", "HEAD"):
                self._json(405, {"error": f"{method} is not supported by this hub"})
                return
            if self.server.listener == "cdn":
                self._cdn()
            else:
                self._route()
        except _Respond:
            pass
        except (TimeoutError, BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True
        finally:
            self._rec.duration = time.monotonic() - t0

    def _abort(self):
        """Close the connection now, without (the rest of) an answer."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, status: int, body: bytes = b"", headers: Iterable[tuple[str, str]] = (), content_type=None):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self._rec.status = status
        self.end_headers()
        if self._method != "HEAD" and body:
            self._rec.bytes_sent += len(body)
            self.wfile.write(body)
        raise _Respond

    def _json(self, status: int, payload, headers: Iterable[tuple[str, str]] = ()):
        body = json.dumps(payload).encode()
        self._send(status, body, headers, "application/json; charset=utf-8")

    def _is_ms(self) -> bool:
        return self._raw_path.startswith(("/api/v1/", "/openapi/"))

    def _fail(self, fault: Fault):
        headers = []
        if fault.retry_after is not None:
            headers.append(("Retry-After", f"{fault.retry_after:g}"))
        message = f"injected failure: HTTP {fault.status}"
        if self._is_ms():
            self._ms_error(fault.status, message, headers)
        self._json(fault.status, {"error": message}, headers)

    # ---------------------------------------------------------------- file bodies

    def _send_blob(self, blob: Blob, headers: list[tuple[str, str]]):
        size = blob.size
        rng = _parse_range(self.headers.get("Range"), size)
        if rng == "unsatisfiable":
            self._send(416, b"", headers + [("Content-Range", f"bytes */{size}")])
        if rng is None:
            status, start, stop = 200, 0, size
        else:
            status, (start, stop) = 206, rng
            headers = headers + [("Content-Range", f"bytes {start}-{stop - 1}/{size}")]
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(stop - start))
        self._rec.status = status
        if self._method == "HEAD":
            self.end_headers()
            raise _Respond
        faults = self.server.hub.faults
        listener, target = self.server.listener, self._target
        cut = faults._take(("drop", "stall"), listener, self._method, target)
        corrupt = faults._take(("corrupt",), listener, self._method, target)
        throttle = faults._take(("throttle",), listener, self._method, target)
        pauses = sorted(faults._take_all("pause", listener, self._method, target), key=lambda f: f.after_bytes)
        applied = [f.kind for f in (cut, corrupt, throttle) if f is not None] + (["pause"] if pauses else [])
        if applied:
            self._rec.fault = ",".join(applied)
        self.end_headers()
        length = stop - start
        corrupt_at = None
        if corrupt is not None and length > 0:
            corrupt_at = min(length - 1, corrupt.offset if corrupt.offset is not None else length // 2)
        chunk_size = CHUNK_SIZE
        if throttle is not None:
            chunk_size = max(1024, min(CHUNK_SIZE, throttle.bytes_per_second // 20))
        hub = self.server.hub
        if hub.total_rate:
            chunk_size = max(1024, min(chunk_size, hub.total_rate // 50))
        sent = 0
        t0 = time.monotonic()
        for chunk in blob.iter_range(start, stop, chunk_size):
            hub._egress(len(chunk))
            if corrupt_at is not None and sent <= corrupt_at < sent + len(chunk):
                mutable = bytearray(chunk)
                mutable[corrupt_at - sent] ^= 0xFF
                chunk = bytes(mutable)
            while chunk:
                piece, cutting, holding = chunk, False, None
                if cut is not None and sent + len(piece) > cut.after_bytes:
                    piece, cutting = piece[: max(0, cut.after_bytes - sent)], True
                if pauses and sent + len(piece) > pauses[0].after_bytes:
                    holding = pauses.pop(0)
                    piece, cutting = piece[: max(0, holding.after_bytes - sent)], False
                if piece:
                    self._rec.bytes_sent += len(piece)
                    self.wfile.write(piece)
                    hub._count_body(len(piece))
                    sent += len(piece)
                    chunk = chunk[len(piece) :]
                if holding is not None:
                    holding._hold()
                    continue
                if cutting:
                    if cut.kind == "stall":
                        self.server.hub._stopping.wait(cut.seconds)
                    self._abort()
                    raise _Respond
                if throttle is not None and not throttle.released.is_set():
                    ahead = sent / throttle.bytes_per_second - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
        raise _Respond

    # ---------------------------------------------------------------- routing

    def _peer(self):
        hub = self.server.hub
        m = re.fullmatch(r"/peer/v1/trees/([0-9a-f]{64})(/files/(.+))?", unquote(self._raw_path))
        tree = hub._peer_trees.get(m.group(1)) if m else None
        if tree is None:
            self._json(404, {"error": "nothing held"})
        if tree["client"] and self._client_name() != tree["client"]:
            self._json(401, {"error": "unauthorized"})
        if m.group(3) is None:
            files = [
                {"path": p, "size": b.size, "have": [list(r) for r in tree["have"].get(p, [(0, b.size)])]}
                for p, b in sorted(tree["files"].items())
            ]
            self._json(200, {"digest": f"sha256:{m.group(1)}", "state": tree["state"], "files": files})
        blob = tree["files"].get(m.group(3))
        if blob is None:
            self._json(404, {"error": "no such file"})
        rng = _parse_range(self.headers.get("Range"), blob.size)
        have = tree["have"].get(m.group(3), [(0, blob.size)])
        if not isinstance(rng, tuple) or not any(a <= rng[0] and rng[1] <= b for a, b in have):
            self._send(416, b"", [("Content-Range", f"bytes */{blob.size}")])
        self._send_blob(blob, [])

    def _route(self):
        if self._raw_path.startswith("/peer/v1/"):
            self._peer()
        segs = self._raw_path.split("/")[1:]
        if segs[:2] == ["api", "models"]:
            self._hf_api([unquote(s) for s in segs[2:]])
        if segs[:3] == ["api", "v1", "models"]:
            self._ms_api([unquote(s) for s in segs[3:]])
        if segs[:1] == ["openapi"]:
            self._json(404, {"code": "ResourceNotFound", "message": "not found", "success": False})
        if segs[:2] == ["api", "v1"]:
            self._ms_error(404, "not found")
        if len(segs) >= 3 and "resolve" in segs[1:3]:
            self._hf_resolve(segs)
        self._json(404, {"error": "Not Found"})

    # ---------------------------------------------------------------- Hugging Face

    _HF_KEYWORDS = {"revision", "tree", "auth-check", "refs", "paths-info", "commits", "resolve"}

    def _hf_split(self, segs: list[str]) -> tuple[str, list[str]]:
        hub = self.server.hub
        if len(segs) >= 2 and ("hf", f"{segs[0]}/{segs[1]}") in hub._repos:
            return f"{segs[0]}/{segs[1]}", segs[2:]
        if segs and ("hf", segs[0]) in hub._repos:
            return segs[0], segs[1:]
        if len(segs) >= 2 and segs[1] not in self._HF_KEYWORDS:
            return f"{segs[0]}/{segs[1]}", segs[2:]
        return (segs[0] if segs else ""), segs[1:]

    def _hf_error(self, status: int, code: str | None, message: str, headers=()):
        headers = list(headers)
        if code:
            headers.append(("X-Error-Code", code))
        headers.append(("X-Error-Message", message))
        self._json(status, {"error": message}, headers)

    def _hf_access(self, repo_id: str, *, download: bool) -> Repo:
        """The repository, if this request may see it (and download from it); else answers the error."""
        hub = self.server.hub
        token = self._rec.token
        if token is not None and not hub._token_known(token):
            self._hf_error(401, None, "Invalid credentials in Authorization header")
        repo = hub._repos.get(("hf", repo_id))
        if repo is None or (repo.private and token not in repo.tokens):
            self._hf_error(401 if token is None else 404, "RepoNotFound", "Repository not found")
        if repo.gated and download and token not in repo.tokens:
            if token is None:
                message = (
                    f"Access to model {repo_id} is restricted. You must have access to it and be authenticated"
                    " to access it. Please log in."
                )
                self._hf_error(401, "GatedRepo", message)
            message = (
                f"Access to model {repo_id} is restricted and you are not in the authorized list."
                f" Visit {hub.url}/{repo_id} to ask for access."
            )
            self._hf_error(403, "GatedRepo", message)
        return repo

    def _hf_commit(self, repo: Repo, revision: str, headers=()) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            self._hf_error(404, "RevisionNotFound", f"Invalid rev id: {revision}", headers)
        return commit

    def _hf_api(self, segs: list[str]):
        repo_id, rest = self._hf_split(segs)
        if rest == ["auth-check"]:
            self._hf_access(repo_id, download=True)
            self._json(200, {})
        repo = self._hf_access(repo_id, download=False)
        if rest == []:
            self._hf_model_info(repo, self._hf_commit(repo, repo.default_branch))
        if len(rest) == 2 and rest[0] == "revision":
            self._hf_model_info(repo, self._hf_commit(repo, rest[1]))
        if rest == ["refs"]:

            def refs(kind: str, names: Mapping[str, str]):
                return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": c} for n, c in sorted(names.items())]

            self._json(200, {"branches": refs("heads", repo.branches), "converts": [], "tags": refs("tags", repo.tags)})
        if len(rest) >= 2 and rest[0] == "tree":
            self._hf_tree(repo, rest[1], "/".join(rest[2:]).strip("/"))
        self._json(404, {"error": "Not Found"})

    def _hf_model_info(self, repo: Repo, commit: Commit):
        blobs = (self._query.get("blobs") or ["false"])[0].lower() == "true"
        siblings = []
        for path in sorted(commit.files, key=lambda p: p.encode()):
            ref = commit.files[path]
            sibling = {"rfilename": path}
            if blobs:
                sibling["size"] = ref.blob.size
                sibling["blobId"] = ref.git_oid
                lfs = self.server.hub._lfs_info(ref, "sha256")
                if lfs is not None:
                    sibling["lfs"] = lfs
            siblings.append(sibling)
        author = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
        self._json(
            200,
            {
                "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "author": author,
                "sha": commit.id,
                "lastModified": _iso(commit.date),
                "createdAt": _iso(repo.created),
                "private": repo.private,
                "gated": "manual" if repo.gated else False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "library_name": None,
                "siblings": siblings,
                "usedStorage": sum(ref.blob.size for ref in commit.files.values()),
            },
        )

    def _hf_tree(self, repo: Repo, revision: str, path: str):
        commit = self._hf_commit(repo, revision)
        recursive = (self._query.get("recursive") or ["false"])[0].lower() in ("true", "1")
        expand = (self._query.get("expand") or ["false"])[0].lower() in ("true", "1")
        entries = self.server.hub._tree(commit, path, recursive)
        if entries is None:
            self._hf_error(404, "EntryNotFound", f'{path} does not exist on "{revision}"')
        start = 0
        cursor = (self._query.get("cursor") or [""])[0]
        if cursor:
            try:
                start = int(base64.urlsafe_b64decode(cursor.encode() + b"==").decode())
            except ValueError:
                self._hf_error(400, None, "Invalid cursor")
        page_size = max(1, int(self.server.hub.page_size))
        page = entries[start : start + page_size]
        out = []
        for kind, entry_path in page:
            if kind == "directory":
                tree_oid = hashlib.sha1(f"{commit.id}:{entry_path}".encode()).hexdigest()
                item = {"type": "directory", "oid": tree_oid, "size": 0, "path": entry_path}
            else:
                ref = commit.files[entry_path]
                item = {"type": "file", "oid": ref.git_oid, "size": ref.blob.size, "path": entry_path}
                lfs = self.server.hub._lfs_info(ref, "oid")
                if lfs is not None:
                    item["lfs"] = lfs
                if ref.xet:
                    item["xetHash"] = ref.xet_hash
            if expand:
                item["lastCommit"] = {"id": commit.id, "title": commit.message, "date": _iso(commit.date)}
            out.append(item)
        headers = []
        if start + page_size < len(entries):
            next_cursor = base64.urlsafe_b64encode(str(start + page_size).encode()).decode().rstrip("=")
            params = [(k, v) for k, values in self._query.items() if k != "cursor" for v in values]
            params.append(("cursor", next_cursor))
            headers.append(("Link", f'<{self.server.hub.url}{self._raw_path}?{urlencode(params)}>; rel="next"'))
        self._json(200, out, headers)

    def _hf_resolve(self, raw_segs: list[str]):
        i = 1 if raw_segs[1] == "resolve" else 2
        repo_id = "/".join(unquote(s) for s in raw_segs[:i])
        if len(raw_segs) < i + 3:
            self._json(404, {"error": "Not Found"})
        revision = unquote(raw_segs[i + 1])
        filename = "/".join(unquote(s) for s in raw_segs[i + 2 :])
        repo = self._hf_access(repo_id, download=True)
        commit = self._hf_commit(repo, revision)
        common = [("X-Repo-Commit", commit.id)]
        ref = commit.files.get(filename)
        if ref is None:
            self._hf_error(404, "EntryNotFound", "Entry not found", common)
        if ref.lfs:
            location = self.server.hub._cdn_link(ref.blob, filename)
            headers = common + [
                ("Location", location),
                ("ETag", f'"{ref.git_oid}"'),
                ("X-Linked-Etag", f'"{ref.blob.sha256}"'),
                ("X-Linked-Size", str(ref.blob.size)),
                ("Vary", "Origin, Accept"),
            ]
            if ref.xet:
                token_url = f"{self.server.hub.url}/api/models/{repo_id}/xet-read-token/{commit.id}"
                headers += [("X-Xet-Hash", ref.xet_hash), ("Link", f'<{token_url}>; rel="xet-auth"')]
            self._send(302, f"Found. Redirecting to {location}".encode(), headers, "text/plain; charset=utf-8")
        self._send_blob(ref.blob, common + [("ETag", f'"{ref.blob.gitsha1}"')])

    # ---------------------------------------------------------------- CDN

    def _cdn(self):
        hub = self.server.hub
        m = re.fullmatch(r"/repos/([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{64})", self._raw_path)
        blob = hub._blobs.get(m.group(3)) if m else None
        expires = (self._query.get("Expires") or [""])[0]
        signature = (self._query.get("Signature") or [""])[0]
        if blob is None or not hub._cdn_signature_ok(m.group(3), expires, signature):
            body = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code></Error>'
            self._send(403, body, (), "application/xml")
        filename = (self._query.get("filename") or [m.group(3)])[0].rsplit("/", 1)[-1]
        disposition = f"attachment; filename*=UTF-8''{quote(filename)}; filename=\"{filename}\";"
        self._send_blob(blob, [("ETag", f'"{blob.sha256}"'), ("Content-Disposition", disposition)])

    # ---------------------------------------------------------------- ModelScope

    def _ms_ok(self, data, headers=()):
        self._json(
            200,
            {"Code": 200, "Data": data, "Message": "success", "RequestId": uuid.uuid4().hex, "Success": True},
            headers,
        )

    def _ms_refuse(self, code: int | str, message: str):
        self._json(
            200, {"Code": code, "Data": None, "Message": message, "RequestId": uuid.uuid4().hex, "Success": False}
        )

    def _ms_error(self, status: int, message: str, headers=()):
        self._json(
            status,
            {"Code": status, "Data": None, "Message": message, "RequestId": uuid.uuid4().hex, "Success": False},
            headers,
        )

    def _ms_api(self, segs: list[str]):
        hub = self.server.hub
        if len(segs) < 2:
            self._ms_error(404, "not found")
        repo_id, rest = f"{segs[0]}/{segs[1]}", segs[2:]
        token = self._rec.token
        if token is not None and not hub._token_known(token):
            self._ms_error(401, "the access token is invalid or expired")
        repo = hub._repos.get(("ms", repo_id))
        if repo is None:
            self._ms_error(404, f"model {repo_id} does not exist")
        if repo.private and token not in repo.tokens:
            if token is None:
                self._ms_error(401, "user not logged in")
            self._ms_error(403, f"no permission to read model {repo_id}")
        if rest == []:
            commit = repo.resolve(repo.default_branch)
            owner, name = repo_id.split("/")
            self._ms_ok(
                {
                    "Id": int(hashlib.md5(repo_id.encode()).hexdigest()[:8], 16),
                    "Name": name,
                    "Path": owner,
                    "ChineseName": "",
                    "Visibility": 1 if repo.private else 5,
                    "Description": "",
                    "Tags": [],
                    "Downloads": 0,
                    "Stars": 0,
                    "CreatedTime": int(repo.created.timestamp()),
                    "LastUpdatedTime": int(commit.date.timestamp()) if commit else 0,
                }
            )
        if rest == ["revisions"]:

            def items(refs: Mapping[str, str]):
                return [
                    {
                        "Revision": name,
                        "CreatedAt": int(repo.commits[commit_id].date.timestamp()),
                        "CreatedBy": "fakehub",
                        "Description": "",
                        "Url": "",
                    }
                    for name, commit_id in sorted(refs.items())
                ]

            self._ms_ok({"RevisionMap": {"Branches": items(repo.branches), "Tags": items(repo.tags)}})
        revision = (self._query.get("Revision") or [""])[0] or repo.default_branch
        commit = repo.resolve(revision)
        if rest == ["repo", "files"]:
            if commit is None:
                self._ms_error(404, f"revision {revision} does not exist")
            self._ms_files(repo, commit)
        if rest == ["repo"]:
            if commit is None:
                self._ms_error(404, f"revision {revision} does not exist")
            file_path = (self._query.get("FilePath") or [""])[0]
            ref = commit.files.get(file_path)
            if ref is None:
                self._ms_error(404, f"file {file_path} does not exist")
            if ref.lfs and hub.ms_lfs_redirect:
                location = hub._cdn_link(ref.blob, file_path)
                self._send(302, b"", [("Location", location)])
            self._send_blob(ref.blob, [("ETag", f'"{ref.blob.sha256}"')])
        self._ms_error(404, "not found")

    def _ms_latest_committer(self, commit: Commit) -> dict:
        latest = {
            "Id": commit.id,
            "ShortId": commit.id[:8],
            "Title": commit.message,
            "Message": commit.message,
            "AuthorName": "fakehub",
            "AuthorEmail": "fakehub@example.invalid",
            "CommitterName": "fakehub",
            "CommitterEmail": "fakehub@example.invalid",
            "CommittedDate": int(commit.date.timestamp()),
            "CreatedAt": int(commit.date.timestamp()),
        }
        return {**latest, "Id": ""} if self.server.hub.ms_latest_committer == "empty-id" else latest

    def _ms_entry_commit(self, repo: Repo, commit: Commit, path: str) -> dict:
        """The per-entry commit fields: the commit that last changed ``path`` (none with ``ms_file_commits`` off)."""
        if not self.server.hub.ms_file_commits:
            return {}
        last = repo.last_change(commit, path)
        return {
            "Revision": last.id,
            "CommitId": last.id,
            "CommitMessage": last.message,
            "CommittedDate": int(last.date.timestamp()),
            "CommitterName": "fakehub",
        }

    def _ms_files(self, repo: Repo, commit: Commit):
        hub = self.server.hub
        recursive = (self._query.get("Recursive") or ["false"])[0].lower() in ("true", "1")
        root = (self._query.get("Root") or [""])[0].strip("/")
        entries = hub._tree(commit, root, recursive)
        if entries is None:
            self._ms_error(404, f"path {root} does not exist")
        # The real API lists directories before files.
        entries.sort(key=lambda e: (e[0] != "directory", e[1].encode()))
        out = []
        for kind, path in entries[: max(1, int(hub.ms_page_size))]:
            name = path.rsplit("/", 1)[-1]
            common = {"Name": name, "Path": path, **self._ms_entry_commit(repo, commit, path), "InCheck": False}
            if kind == "directory":
                out.append({**common, "Type": "tree", "Size": 0, "Sha256": "", "IsLFS": False, "Mode": "40000"})
            else:
                ref = commit.files[path]
                size, sha256 = ref.blob.size, ref.blob.sha256
                out.append(
                    {**common, "Type": "blob", "Size": size, "Sha256": sha256, "IsLFS": ref.lfs, "Mode": "33188"}
                )
        data = {"Files": out, "IsVisual": 0, "LatestCommitter": self._ms_latest_committer(commit)}
        if hub.ms_latest_committer == "absent":
            del data["LatestCommitter"]
        self._ms_ok(data)


# --------------------------------------------------------------------------------------------------
# The hub
# --------------------------------------------------------------------------------------------------


class FakeHub:
    """A fake Hugging Face + ModelScope hub on loopback. Use ``with FakeHub() as hub:`` or start/stop.

    ``url`` serves both hubs (use it as the Hugging Face endpoint and as ``MODELSCOPE_ENDPOINT``);
    ``cdn_url`` is where LFS downloads are redirected (another loopback address when available).

    Knobs, changeable at any time: ``page_size`` (tree entries per page on Hugging Face, default
    1000 as the real hub), ``ms_page_size`` (entries at which a ModelScope listing is truncated,
    default 3000 as the real API), ``lfs_threshold`` (files of at least this many bytes are LFS;
    applies to files added afterwards), ``ms_lfs_redirect`` (ModelScope LFS downloads go through the
    CDN), ``xet_lfs_info`` (Hugging Face listings give Xet-backed files their ``lfs`` object, sha256
    included, as the real hub does; ``False`` lists only their ``xetHash``, as a hub or mirror that
    dropped it would), ``ms_latest_committer`` (ModelScope listings' ``Data.LatestCommitter``:
    ``"present"``, the default; ``"absent"`` leaves it out; ``"empty-id"`` keeps it with ``Id: ""``,
    ``ShortId`` and the rest still there, as real answers sometimes have it), ``ms_file_commits``
    (ModelScope listing entries carry ``Revision``/``CommitId``/``CommitMessage``/``CommittedDate``/
    ``CommitterName``, of the commit that last changed them; ``False`` leaves these out, as a mirror
    dropping them would), ``faults`` (see ``Faults``). ``requests`` is the log of every request, both
    listeners, in arrival order.

    ``tls=(certfile, keyfile)`` serves HTTPS on both listeners (the certificate must name 127.0.0.1
    and the CDN address), asking for a client certificate of ``client_ca`` when given; ``cdn_host=None``
    puts the CDN on a second port of ``host``.
    """

    def __init__(
        self,
        *,
        lfs_threshold: int = 1024,
        page_size: int = 1000,
        ms_page_size: int = 3000,
        host: str = "127.0.0.1",
        cdn_host: str | None = "127.0.0.2",
        ms_lfs_redirect: bool = True,
        xet_lfs_info: bool = True,
        ms_latest_committer: str = "present",
        ms_file_commits: bool = True,
        tls: tuple[str | os.PathLike, str | os.PathLike] | None = None,
        client_ca: str | os.PathLike | None = None,
    ):
        self.lfs_threshold = lfs_threshold
        self.xet_lfs_info = xet_lfs_info
        self.page_size = page_size
        self.ms_page_size = ms_page_size
        self.ms_lfs_redirect = ms_lfs_redirect
        self.ms_latest_committer = ms_latest_committer
        self.ms_file_commits = ms_file_commits
        self.faults = Faults()
        self._host = host
        self._cdn_host = cdn_host
        self._tls = None
        if tls is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(str(tls[0]), str(tls[1]))
            if client_ca is not None:
                self._tls.load_verify_locations(cafile=str(client_ca))
                self._tls.verify_mode = ssl.CERT_OPTIONAL
        self._lock = threading.RLock()
        self._repos: dict[tuple[str, str], Repo] = {}
        self._blobs: dict[str, Blob] = {}
        self._tokens: set[str] = set()
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._secret = secrets.token_bytes(16)
        self._seq = itertools.count(1)
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []
        self.total_rate = 0
        self.body_bytes = 0
        self._egress_lock = threading.Lock()
        self._egress_next = 0.0
        self._peer_trees: dict[str, dict] = {}
        self.url = ""
        self.cdn_url = ""

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> FakeHub:
        if self._servers:
            return self
        self._stopping.clear()
        hub_server = _Server((self._host, 0), self, "hub", self._tls)
        cdn_server = None
        if self._cdn_host:
            try:
                cdn_server = _Server((self._cdn_host, 0), self, "cdn", self._tls)
            except OSError:
                cdn_server = None  # no such loopback address here: a second port will do
        if cdn_server is None:
            cdn_server = _Server((self._host, 0), self, "cdn", self._tls)
        self._servers = [hub_server, cdn_server]
        scheme = "https" if self._tls else "http"
        self.url = f"{scheme}://{hub_server.server_address[0]}:{hub_server.server_address[1]}"
        self.cdn_url = f"{scheme}://{cdn_server.server_address[0]}:{cdn_server.server_address[1]}"
        for server in self._servers:
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping.set()
        for server in self._servers:
            server.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        Faults._release_pauses(self.faults)  # their bodies end on the connections just shut
        for server in self._servers:
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers, self._threads = [], []

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- content

    def add_token(self, token: str) -> None:
        """Make ``token`` a valid token of this hub (with access to public repositories only)."""
        with self._lock:
            self._tokens.add(token)

    def grant(self, repo_id: str, token: str, *, kind: str = "hf") -> None:
        """Give ``token`` access to a private or gated repository."""
        with self._lock:
            self._repos[(kind, repo_id)].tokens.add(token)
            self._tokens.add(token)

    def set_private(self, repo_id: str, private: bool = True, *, kind: str = "hf") -> None:
        """Make a repository private (only its granted tokens read it) or public again."""
        with self._lock:
            self._repos[(kind, repo_id)].private = private

    def delete_repo(self, repo_id: str, *, kind: str = "hf") -> None:
        """Delete a repository: the hub answers as for one that never existed (its blobs stay on the CDN
        for the other repositories that share them)."""
        with self._lock:
            del self._repos[(kind, repo_id)]

    def add_hf_repo(
        self,
        repo_id: str,
        files: Mapping[str, FileSource],
        *,
        branch: str = "main",
        tags: Iterable[str] = (),
        private: bool = False,
        token: str | Iterable[str] | None = None,
        gated: bool = False,
        xet: bool = False,
        message: str = "initial commit",
    ) -> str:
        """Create a Hugging Face model repository with one commit on ``branch``; return the commit id.

        ``files`` maps paths to bytes (or to a file on disk). ``token``: the token(s) granted access
        (for private or gated repositories). ``xet``: the repository stores its LFS files (those of at
        least ``lfs_threshold`` bytes, in this and later commits) in Xet storage, as repositories on
        the real hub now do: tree entries carry ``xetHash`` (and the ``lfs`` object, see
        ``xet_lfs_info``), downloads answer ``X-Xet-Hash`` on their redirect to the CDN.
        """
        return self._add_repo("hf", repo_id, files, branch, tags, private, token, gated, message, xet=xet)

    def add_hf_commit(
        self,
        repo_id: str,
        files: Mapping[str, FileSource | None],
        *,
        branch: str = "main",
        tags: Iterable[str] = (),
        message: str = "update",
        parent: str | None = None,
    ) -> str:
        """Commit on ``branch`` (created from ``parent`` or the default branch if new): ``files`` is
        merged onto the parent's tree, a ``None`` value deletes that path. Older commits stay readable."""
        return self._add_commit("hf", repo_id, files, branch, tags, message, parent)

    def add_ms_repo(
        self,
        repo_id: str,
        files: Mapping[str, FileSource],
        *,
        revision: str = "master",
        tags: Iterable[str] = (),
        private: bool = False,
        token: str | Iterable[str] | None = None,
        message: str = "initial commit",
    ) -> str:
        """Create a ModelScope model repository (``owner/name``) with one commit on branch ``revision``."""
        if repo_id.count("/") != 1:
            raise ValueError("a ModelScope repository id is owner/name")
        return self._add_repo("ms", repo_id, files, revision, tags, private, token, False, message)

    def add_ms_commit(
        self,
        repo_id: str,
        files: Mapping[str, FileSource | None],
        *,
        revision: str = "master",
        tags: Iterable[str] = (),
        message: str = "update",
        parent: str | None = None,
    ) -> str:
        """As ``add_hf_commit``, for a ModelScope repository."""
        return self._add_commit("ms", repo_id, files, revision, tags, message, parent)

    def _add_repo(self, kind, repo_id, files, branch, tags, private, token, gated, message, *, xet=False) -> str:
        with self._lock:
            if (kind, repo_id) in self._repos:
                raise ValueError(f"{kind} repository {repo_id} exists already")
            tokens = {token} if isinstance(token, str) else set(token or ())
            self._tokens |= tokens
            self._repos[(kind, repo_id)] = Repo(
                kind, repo_id, branch, private=private, gated=gated, xet=xet, tokens=tokens
            )
            return self._add_commit(kind, repo_id, files, branch, tags, message, None)

    def _add_commit(self, kind, repo_id, files, branch, tags, message, parent) -> str:
        with self._lock:
            xet = self._repos[(kind, repo_id)].xet
        refs = {}
        for path, source in files.items():
            lfs = source is not None and self._size(source) >= self.lfs_threshold
            refs[path] = None if source is None else FileRef(self._blob(source), lfs, xet=xet and lfs)
        with self._lock:
            repo = self._repos[(kind, repo_id)]
            if parent is None:
                parent = repo.branches.get(branch) or repo.branches.get(repo.default_branch)
            tree = dict(repo.commits[parent].files) if parent else {}
            for path, ref in refs.items():
                if ref is None:
                    tree.pop(path, None)
                else:
                    self._check_path(path)
                    tree[path] = ref
            seq = next(self._seq)
            digest = hashlib.sha1(
                f"{kind}\0{repo_id}\0{parent}\0{seq}\0{message}\0".encode()
                + "".join(f"{p}\0{r.git_oid}\0" for p, r in sorted(tree.items())).encode()
            ).hexdigest()
            date = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(minutes=seq)
            repo.commits[digest] = Commit(digest, parent, tree, message, date)
            repo.branches[branch] = digest
            for tag in tags:
                repo.tags[tag] = digest
            return digest

    @staticmethod
    def _size(source: FileSource) -> int:
        if isinstance(source, (bytes, bytearray, memoryview)):
            return len(source)
        return Path(source).stat().st_size

    @staticmethod
    def _check_path(path: str) -> None:
        if not path or path.startswith("/") or path.endswith("/") or "//" in path:
            raise ValueError(f"bad path {path!r}")

    def _blob(self, source: FileSource) -> Blob:
        blob = Blob(source)
        with self._lock:
            return self._blobs.setdefault(blob.sha256, blob)

    def files(self, repo_id: str, revision: str | None = None, *, kind: str = "hf") -> dict[str, bytes]:
        """The exact bytes the hub serves for every file of ``repo_id`` at ``revision``."""
        return {path: ref.blob.read() for path, ref in self._commit(kind, repo_id, revision).files.items()}

    def commit_id(self, repo_id: str, revision: str | None = None, *, kind: str = "hf") -> str:
        """The commit a branch, tag or commit id points at."""
        return self._commit(kind, repo_id, revision).id

    def file_info(self, repo_id: str, path: str, revision: str | None = None, *, kind: str = "hf") -> FileRef:
        """The served file's ``blob`` (``size``, ``sha256``, ``gitsha1``) and ``lfs`` flag."""
        return self._commit(kind, repo_id, revision).files[path]

    def _commit(self, kind: str, repo_id: str, revision: str | None) -> Commit:
        with self._lock:
            repo = self._repos[(kind, repo_id)]
            commit = repo.resolve(revision or repo.default_branch)
            if commit is None:
                raise KeyError(f"{repo_id} has no revision {revision}")
            return commit

    # ---------------------------------------------------------------- egress and peer emulation

    def reset_body_bytes(self) -> None:
        with self._egress_lock:
            self.body_bytes = 0

    def _count_body(self, n: int) -> None:
        with self._egress_lock:
            self.body_bytes += n

    def _egress(self, n: int) -> None:
        """Wait until ``n`` more body bytes fit under ``total_rate`` (shared by every connection)."""
        rate = self.total_rate
        if not rate:
            return
        with self._egress_lock:
            now = time.monotonic()
            start = max(self._egress_next, now - 0.05)
            self._egress_next = start + n / rate
        if start > now:
            self._stopping.wait(start - now)

    def serve_peer(
        self,
        hex_digest: str,
        files: Mapping[str, FileSource],
        *,
        have: Mapping[str, list[tuple[int, int]]] | None = None,
        client: str | None = None,
        state: str = "Ready",
    ) -> None:
        """Answer the peer endpoints for ``hex_digest`` with ``files`` (``have``: the ranges held per
        path, everything when not given; ``client``: the subject CN of the client certificate required)."""
        blobs = {path: self._blob(source) for path, source in files.items()}
        with self._lock:
            tree = {"files": blobs, "have": dict(have or {}), "client": client, "state": state}
            self._peer_trees[hex_digest] = tree

    # ---------------------------------------------------------------- request log

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def requests_matching(self, match: str | re.Pattern, *, method: str | None = None) -> list[RecordedRequest]:
        out = []
        for r in self.requests:
            target = unquote(r.target)
            if method is not None and r.method != method:
                continue
            if match.search(target) if isinstance(match, re.Pattern) else match in target:
                out.append(r)
        return out

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # ---------------------------------------------------------------- internals used by the handler

    def _record(self, rec: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(rec)

    def _connections_add(self, conn) -> None:
        with self._lock:
            self._connections.add(conn)

    def _connections_discard(self, conn) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _token_known(self, token: str) -> bool:
        with self._lock:
            return token in self._tokens

    def _tree(self, commit: Commit, path: str, recursive: bool) -> list[tuple[str, str]] | None:
        """``[(kind, path)]`` under ``path`` ("" = root), sorted by path; None if ``path`` is no directory."""
        dirs = commit.directories()
        if path and path not in dirs:
            return None
        prefix = f"{path}/" if path else ""
        entries: list[tuple[str, str]] = []
        for kind, paths in (("directory", dirs), ("file", commit.files.keys())):
            for p in paths:
                if not p.startswith(prefix):
                    continue
                if not recursive and "/" in p[len(prefix) :]:
                    continue
                entries.append((kind, p))
        entries.sort(key=lambda e: e[1].encode())
        return entries

    def _lfs_info(self, ref: FileRef, sha256_key: str) -> dict | None:
        """The ``lfs`` object listed for ``ref`` (``sha256_key``: ``oid`` in trees, ``sha256`` in siblings)."""
        if not ref.lfs or (ref.xet and not self.xet_lfs_info):
            return None
        return {sha256_key: ref.blob.sha256, "size": ref.blob.size, "pointerSize": ref.pointer_size}

    def _cdn_link(self, blob: Blob, filename: str) -> str:
        expires = str(int(time.time()) + 3600)
        signature = hmac.new(self._secret, f"{blob.sha256}:{expires}".encode(), hashlib.sha256).hexdigest()
        query = urlencode({"filename": filename, "Expires": expires, "Signature": signature})
        return f"{self.cdn_url}/repos/{blob.sha256[:2]}/{blob.sha256[2:4]}/{blob.sha256}?{query}"

    def _cdn_signature_ok(self, sha256: str, expires: str, signature: str) -> bool:
        if not expires.isdigit() or int(expires) < time.time():
            return False
        expected = hmac.new(self._secret, f"{sha256}:{expires}".encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, signature)
