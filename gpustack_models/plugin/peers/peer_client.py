"""Asking other nodes' plugins for a digest's bytes: the client side of the peer endpoints.

- ``GET {url}/peer/v1/trees/<hex>``: ``{"digest", "state", "files": [{"path", "size", "have":
  [[start, end], ...]}]}``, the half-open ranges the peer holds; 404 when it holds nothing.
- ``GET {url}/peer/v1/trees/<hex>/files/<path>`` with ``Range: bytes=a-b``: 206 with exactly those
  bytes; 416 when the peer does not hold the whole range; 503 with ``Retry-After`` at its connection
  limit; 401/403 refusals (``sources.hub_errors.peer_reason`` says what each status means).

Every connection presents this plugin's client certificate (``PeerAccess.tls()``, a TLS context that
also verifies the peer's serving certificate against the peers' CA; a renewed certificate is used by new
connections at once) and no request carries a credential in a header; a peer is never reached through
the ticket's proxy. The bytes a
peer sends are written like a hub's (``pwrite`` at their offset, hashed by the frontier), but under
the file's lock and only while the file's epoch is the segment's, and never past the segment's end
(which a straggler split may move): bytes of a file thrown away after a bad peer never land again.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.fetch import Sink
from gpustack_models.plugin.engine.frontier import HashFrontier
from gpustack_models.plugin.engine.limits import RateLimiter
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.ticket import FetchTicket, PeerSource, origin
from gpustack_models.plugin.engine.transport import ConnectionPool, HttpError, StreamedResponse
from gpustack_models.plugin.peers.contract import PREFIX
from gpustack_models.plugin.peers.swarm import Segment
from gpustack_models.sources.hub_errors import ACCESS_DENIED, BUSY, NOT_HELD, peer_reason, retry_after_seconds

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_MAX_TREE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class PeerAccess:
    """How this node reaches its peers: ``tls()`` the TLS context of a new connection (its client
    certificate, the peers' CA: ``contract.ClientCertificate``), ``refresh(digest)`` the ticket asked for
    again, for its current peers and ``joining`` (or ``None``)."""

    tls: Callable[[], ssl.SSLContext]
    refresh: Callable[[str], FetchTicket | None] | None = None


class PeerError(Exception):
    """A peer failed a request (network, unexpected answer): counted against it."""


class PeerRefused(PeerError):
    """A peer refused us (401/403) or holds nothing (404): no use asking it again in this download."""


class PeerBusy(Exception):
    """A peer at its connection limit (503): ask it again after ``retry_after`` seconds."""

    def __init__(self, retry_after: float):
        super().__init__(f"busy, retry after {retry_after:g}s")
        self.retry_after = retry_after


class PeerMissing(Exception):
    """A peer answered 416: it does not hold the range it listed."""


class Stale(Exception):
    """The segment's file was thrown away meanwhile (a new epoch): its bytes are not wanted."""


def _retry_after(response: StreamedResponse) -> float:
    """A busy peer's ``Retry-After``, 1 second when it gave none that reads."""
    seconds = retry_after_seconds(response.header("Retry-After"))
    return 1.0 if seconds is None else seconds


def parse_tree(document, sizes: dict[str, int]) -> tuple[str, dict[str, list[tuple[int, int]]]]:
    """``(state, {path: ranges})`` of a tree answer, keeping only the manifest's paths and ranges
    inside their files; raises ``PeerError`` for an answer of the wrong shape."""
    if not isinstance(document, dict) or not isinstance(document.get("files"), list):
        raise PeerError("the tree answer is not a tree")
    files: dict[str, list[tuple[int, int]]] = {}
    for item in document["files"]:
        path = item.get("path") if isinstance(item, dict) else None
        if path not in sizes or not isinstance(item.get("have"), list):
            continue
        ranges = []
        for pair in item["have"]:
            if isinstance(pair, list) and len(pair) == 2 and all(type(v) is int for v in pair):
                start, end = pair[0], min(pair[1], sizes[path])
                if 0 <= start < end:
                    ranges.append((start, end))
        files[path] = ranges
    state = document.get("state") if document.get("state") in ("Ready", "Downloading") else "Downloading"
    if state == "Ready" and any(files.get(p) != [(0, n)] for p, n in sizes.items() if n):
        state = "Downloading"  # a Ready peer listing less than everything is trusted for what it lists
    return state, files


class PeerClient:
    """The requests of one download to its peers (``close()`` when done; ``abort()`` from any thread)."""

    def __init__(self, hex_digest: str, access: PeerAccess, timeout: float, rate: RateLimiter, frontier: HashFrontier):
        self.hex = hex_digest
        self.access = access
        self._rate = rate
        self._frontier = frontier
        self._pool = ConnectionPool(proxy=None, ca_bundle=None, timeout=timeout, tls=access.tls)
        self._polls = ConnectionPool(proxy=None, ca_bundle=None, timeout=min(timeout, 5.0), tls=access.tls)
        self._active: set[StreamedResponse] = set()
        self._lock = threading.Lock()

    def close(self) -> None:
        self._pool.close()
        self._polls.close()

    def abort(self, node: str | None = None) -> None:
        """Drop the requests in flight (to ``node`` only, if given)."""
        with self._lock:
            active = [r for r in self._active if node is None or getattr(r, "peer", None) == node]
        for response in active:
            response.abort()

    def _get(self, pool: ConnectionPool, peer: PeerSource, path: str, headers: dict) -> StreamedResponse:
        url = f"{peer.url}{PREFIX}{self.hex}{path}"
        try:
            self.access.tls()  # loaded (and kept) before the pool asks for it
        except Exception as exc:  # no client certificate (yet): no peer will take us
            raise PeerRefused(f"no client certificate: {exc}") from None
        try:
            return pool.get(url, credentials={}, credentials_origin=origin(peer.url), headers=headers)
        except HttpError as exc:
            raise PeerError(str(exc)) from None

    # ---------------------------------------------------------------- the tree

    def tree(self, peer: PeerSource, sizes: dict[str, int]) -> tuple[str, dict[str, list[tuple[int, int]]]]:
        """What ``peer`` holds; its connection kept for the next poll when the answer was read whole (a poll
        every ``peer_poll`` seconds must not cost a TLS handshake on both nodes each time)."""
        response = self._get(self._polls, peer, "", {})
        answer = peer_reason(response.status, tree=True)
        reuse = False
        try:
            if answer == ACCESS_DENIED:
                raise PeerRefused(f"tree answered HTTP {response.status}")
            if answer in (NOT_HELD, BUSY):  # nothing held yet, or busy: nothing to take from it now
                reuse = True
                response._resp.read(_MAX_TREE_BYTES + 1)  # a short Status
                return "Downloading", {}
            if response.status != 200 or (response.length or 0) > _MAX_TREE_BYTES:
                raise PeerError(f"tree answered HTTP {response.status}")
            body = response._resp.read(_MAX_TREE_BYTES + 1)
            document = json.loads(body)
            reuse = True
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise PeerError(f"tree: {type(exc).__name__}: {exc}") from None
        finally:
            response.close(reuse=reuse)
        return parse_tree(document, sizes)

    # ---------------------------------------------------------------- a segment

    def fetch(self, seg: Segment, peer: PeerSource, view: memoryview, stopped: Callable[[], bool]) -> int:
        """Fetch ``seg`` from ``peer`` from ``seg.pos``; the bytes written (``seg.pos`` follows them)."""
        f, start = seg.f, seg.pos
        headers = {"Range": f"bytes={start}-{seg.end - 1}"}
        response = self._get(self._pool, peer, f"/files/{quote(f.file.path)}", headers)
        response.peer = peer.node
        with self._lock:
            self._active.add(response)
        try:
            self._check(response, f.size, start)
            self._read(seg, response, view, stopped)
        except (OSError, http.client.HTTPException) as exc:
            if not stopped():
                raise PeerError(f"{f.file.path} at byte {seg.pos}: {type(exc).__name__}: {exc}") from None
        finally:
            with self._lock:
                self._active.discard(response)
            response.close(reuse=seg.pos >= seg.end and response.length == 0)
        return seg.pos - start

    def read(
        self,
        peer: PeerSource,
        f: FileProgress,
        start: int,
        end: int,
        view: memoryview,
        sink: Sink,
        stopped: Callable[[], bool],
    ) -> int:
        """Read ``[start, end)`` of ``f`` from ``peer`` into ``sink(chunk, pos)`` instead of the file (a file
        being re-checked compares them with its own); the bytes read, all of them unless the peer failed
        (``PeerError``, ``PeerBusy``, ``PeerMissing``) or the download stopped (``stopped()``)."""
        response = self._get(self._pool, peer, f"/files/{quote(f.file.path)}", {"Range": f"bytes={start}-{end - 1}"})
        response.peer = peer.node
        with self._lock:
            self._active.add(response)
        pos = start
        try:
            self._check(response, f.size, start)
            while pos < end and not stopped():
                n = self._rate.chunk(min(len(view), end - pos))
                if not self._rate.acquire(n, stopped):
                    break
                got = response.readinto(view[:n])
                if got <= 0:
                    raise http.client.IncompleteRead(b"", end - pos)
                sink(view[:got], pos)
                pos += got
        except (OSError, http.client.HTTPException) as exc:
            raise PeerError(f"{f.file.path} at byte {pos}: {type(exc).__name__}: {exc}") from None
        finally:
            with self._lock:
                self._active.discard(response)
            response.close(reuse=pos >= end and response.length == 0)
        return pos - start

    @staticmethod
    def _check(response: StreamedResponse, size: int, start: int) -> None:
        status = response.status
        if status == 206:
            m = _CONTENT_RANGE.fullmatch((response.header("Content-Range") or "").strip())
            if m is None or int(m.group(1)) != start or m.group(3) not in ("*", str(size)):
                raise PeerError(f"unexpected Content-Range {response.header('Content-Range')!r}")
            return
        response.drain_small()
        answer = peer_reason(status)
        if answer == NOT_HELD:
            raise PeerMissing()
        if answer == BUSY:
            raise PeerBusy(_retry_after(response))
        if answer == ACCESS_DENIED:
            raise PeerRefused(f"answered HTTP {status}")
        raise PeerError(f"answered HTTP {status}")

    def _read(self, seg: Segment, response: StreamedResponse, view: memoryview, stopped: Callable[[], bool]) -> None:
        """Read the body into the file at ``seg.pos`` until ``seg.end`` (read each time: a split moves it)."""
        rate, size, f = self._rate, len(view), seg.f
        fd = f.open()
        while not stopped():
            with seg.lock:
                want = seg.end - seg.pos
            if want <= 0:
                return
            n = rate.chunk(min(size, want))
            if not rate.acquire(n, stopped):
                return
            got = response.readinto(view[:n])
            if got <= 0:
                raise http.client.IncompleteRead(b"", want)
            self._write(seg, fd, view[:got])

    def _write(self, seg: Segment, fd: int, chunk: memoryview) -> None:
        """Write ``chunk`` at ``seg.pos`` (cut at ``seg.end``) if the file's epoch is still the
        segment's, note the range and its peer, then hash what it makes contiguous."""
        f, pos = seg.f, seg.pos
        with f.lock:
            if f.epoch != seg.epoch:
                raise Stale()
            with seg.lock:
                n = min(len(chunk), seg.end - pos)
                if n <= 0:
                    return
                disk.write_at(fd, chunk[:n], pos)
                seg.pos = pos + n
            f.add_range(pos, pos + n)
            f.note_peer(seg.source or "", pos, pos + n)
            f.dirty = True
        self._frontier.advance(f, pos, chunk[:n] if f.epoch == seg.epoch else None)
