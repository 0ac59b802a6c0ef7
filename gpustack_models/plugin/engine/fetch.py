"""Fetching byte ranges of a ticket's files over HTTP, with retries.

A part ``[start, end)`` of a file is asked for with one ``Range`` request (redirects followed, a
redirect's target remembered for the file's later parts). The body is read straight into the
fetching thread's buffer, each read first taking its bytes from the node-wide rate limiter, written with
``pwrite`` at its offset and handed to the hash frontier. A read that stalls (no byte for
``stall_timeout``) or a connection that drops is retried from the part's first byte not written,
at most ``range_retries`` times; a 5xx or 429 answer is retried ``http_retries`` times, honouring
the hub's ``Retry-After`` up to ``http_retry_max_wait``; any other status fails the part for the reason
``sources.hub_errors.file_reason`` names. Disk errors are not retried: they come out of ``disk`` as
``DiskError`` and pass through untouched.

A part is asked of the ticket's sources in turn: when one fails it (a refusal, a 404, the hub
unavailable past the retries: ``FALLTHROUGH_REASONS``), the next one takes over from the part's first
byte not written, and the part fails only when every source failed. A source that failed is tried
after the others for a while (``SourcePenalties``, shared by the node's downloads), so the next parts
and attempts do not start with it.
"""

from __future__ import annotations

import http.client
import logging
import re
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.failures import FALLTHROUGH_REASONS, DownloadFailed, SourcePenalties
from gpustack_models.plugin.engine.frontier import HashFrontier
from gpustack_models.plugin.engine.limits import RateLimiter
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.registry_auth import RegistryAuth
from gpustack_models.plugin.engine.ticket import OCI, FetchTicket, HubSource, origin
from gpustack_models.plugin.engine.transport import ConnectionPool, HttpError, StreamedResponse
from gpustack_models.sources.hub_errors import (
    ACCESS_DENIED,
    INTEGRITY_MISMATCH,
    SOURCE_UNAVAILABLE,
    error_code_detail,
    file_reason,
    retry_after_seconds,
    transient,
)

log = logging.getLogger(__name__)
Sink = Callable[[memoryview, int], None]  # ``sink(chunk, pos)``: bytes at ``pos`` read instead of written
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class _Retry(Exception):
    """A range attempt failed in a way worth retrying from the last written byte (``pos``)."""

    def __init__(self, message: str, pos: int | None = None):
        super().__init__(message)
        self.pos = pos


class _HubStatus(Exception):
    """The hub answered a status worth retrying a few times (5xx, 429)."""

    def __init__(self, message: str, retry_after: float | None):
        super().__init__(message)
        self.retry_after = retry_after


def _where(url: str) -> str:
    """A URL for messages: the origin only. Messages end up in the node's status, which must not
    name a repository; signed CDN links also carry signatures in their query."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _error_detail(response: StreamedResponse) -> str:
    code = response.header("X-Error-Code")
    response.drain_small()
    return error_code_detail(code)


def _status_error(f: FileProgress, response: StreamedResponse, pos: int, end: int) -> Exception:
    """What an answer other than 200/206 to ``bytes=pos-(end-1)`` means: a failure, or ``_HubStatus``."""
    status = response.status
    detail = _error_detail(response)
    where = f"{f.file.path}: GET {_where(response.url)}"
    if transient(status):
        retry_after = retry_after_seconds(response.header("Retry-After"))
        return _HubStatus(f"{where} answered HTTP {status}{detail}", retry_after)
    reason = file_reason(status)
    if reason == INTEGRITY_MISMATCH:
        f.bad = True
        return DownloadFailed(reason, f"{where} refused bytes {pos}-{end - 1}: the hub's file is shorter than {f.size}")
    if reason == SOURCE_UNAVAILABLE:
        return DownloadFailed(reason, f"{where} answered unexpected HTTP {status}{detail}")
    return DownloadFailed(reason, f"{where} answered HTTP {status}{detail}")


def _size_mismatch(f: FileProgress, served) -> DownloadFailed:
    f.bad = True
    return DownloadFailed(
        INTEGRITY_MISMATCH, f"{f.file.path}: the hub serves {served} bytes, the manifest says {f.size}"
    )


def _body_span(f: FileProgress, response: StreamedResponse, pos: int, end: int, extent=None) -> tuple[int, int]:
    """``(bytes to skip, position to stop at)`` of a 200/206 answer's body for ``[pos, end)``. ``extent``:
    ``(offset, size)`` of the blob holding the file's bytes from ``offset`` on (the file itself: ``(0, f.size)``)."""
    offset, whole = extent or (0, f.size)
    if response.status != 206:  # 200: the whole blob, the Range was ignored
        if response.length is not None and response.length != whole:
            raise _size_mismatch(f, response.length)
        return offset + pos, end
    m = _CONTENT_RANGE.fullmatch((response.header("Content-Range") or "").strip())
    if m is None or int(m.group(1)) != offset + pos:
        raise _Retry(f"{f.file.path}: unexpected Content-Range {response.header('Content-Range')!r}")
    if m.group(3) != "*" and int(m.group(3)) != whole:
        raise _size_mismatch(f, m.group(3))
    return 0, min(end, int(m.group(2)) + 1 - offset)


def _every_source_failed(failures: list[DownloadFailed]) -> DownloadFailed:
    """The failure of a part no source could serve: the first source's, counting the others."""
    if not failures:
        return DownloadFailed(SOURCE_UNAVAILABLE, "the ticket offers no source")
    first = failures[0]
    if len(failures) == 1:
        return first
    message = f"{first.message} (all {len(failures)} sources failed)"
    return DownloadFailed(first.reason, message, retry_after=first.retry_after)


def _source_key(hub: HubSource) -> tuple:
    return hub.key


def _end(end: int, seg) -> int:
    """Where a part stops: ``end``, or earlier if its segment's end moved down."""
    if seg is None:
        return end
    with seg.lock:
        return min(end, seg.end)


def _claim(seg, pos: int, n: int) -> tuple[int, int]:
    """Claim the next read of a segment, ``n`` bytes at ``pos`` at most: ``(segment end, bytes to read)``."""
    with seg.lock:
        n = min(n, seg.end - pos)
        seg.claim = pos + max(n, 0)
        return seg.end, n


def _lost(f: FileProgress, exc: BaseException, pos: int) -> str:
    kind = "stalled" if isinstance(exc, (socket.timeout, TimeoutError)) else "connection lost"
    return f"{f.file.path}: {kind} at byte {pos}: {type(exc).__name__}: {exc}"


class RangeFetcher:
    """Fetches parts of ``ticket``'s files into their partial files, for one download.

    ``open()`` before the first ``fetch``, ``close()`` after the last; ``abort()`` (any thread)
    interrupts every request in flight. ``stop`` set means the download is over: fetching ends at
    the next read. ``stat(name, n)`` counts ``requests``, ``network_bytes`` and ``retries``;
    ``on_bytes(n)`` hears of every ``n`` body bytes written. ``penalties``: the sources that failed
    lately on the node (the fetcher's own when not given).
    """

    def __init__(
        self,
        ticket: FetchTicket,
        settings,
        rate: RateLimiter,
        frontier: HashFrontier,
        stop: threading.Event,
        stat: Callable[..., None],
        on_bytes: Callable[[int], None] | None = None,
        penalties: SourcePenalties | None = None,
    ):
        self.ticket = ticket
        self.settings = settings
        self._rate = rate
        self._frontier = frontier
        self._stop = stop
        self._stat = stat
        self._on_bytes = on_bytes
        self._penalties = penalties if penalties is not None else SourcePenalties()
        self._pool: ConnectionPool | None = None
        self._auth: RegistryAuth | None = None
        self._sources: tuple[HubSource, ...] = ()
        self._active: set[StreamedResponse] = set()
        self._active_lock = threading.Lock()

    # ---------------------------------------------------------------- lifecycle

    def open(self) -> None:
        """Before the first ``fetch``, once the ticket is validated."""
        ticket = self.ticket
        self._sources = ticket.sources
        self._pool = ConnectionPool(proxy=ticket.proxy, ca_bundle=ticket.ca_bundle, timeout=self.settings.stall_timeout)
        self._auth = RegistryAuth(self._pool)

    def close(self) -> None:
        self._pool.close()

    def abort(self) -> None:
        """Interrupt every request in flight: their readers see a dropped connection."""
        with self._active_lock:
            active = list(self._active)
        for response in active:
            response.abort()

    # ---------------------------------------------------------------- a part, from the sources in turn

    def fetch(
        self, f: FileProgress, start: int, end: int, view: memoryview, seg=None, sink: Sink | None = None
    ) -> None:
        """Fetch ``[start, end)`` of ``f`` from the first source that serves it: a source failing for
        one of ``FALLTHROUGH_REASONS`` hands over to the next from the first byte not written; fails
        when every source failed. ``seg`` (a ``swarm.Segment`` of these bytes): its ``end`` may move
        down while the bytes come (another source takes the tail); reading stops there, and ``seg.claim``
        tells the mover how far the read under way reaches. ``sink(chunk, pos)``: the bytes go to it
        instead of the file (a file being re-checked compares them with what it holds)."""
        cursor = [start]  # the first byte not written, across sources
        failures: list[DownloadFailed] = []
        for hub in self._penalties.order(self._sources, _source_key):
            try:
                self._fetch_from(hub, f, cursor, end, view, seg, sink)
            except DownloadFailed as exc:
                if exc.reason not in FALLTHROUGH_REASONS or self._stop.is_set():
                    raise
                self._source_failed(hub, f, exc)
                failures.append(exc)
                continue
            if cursor[0] >= _end(end, seg):
                self._penalties.served(hub.key)
            return
        raise _every_source_failed(failures)

    def _source_failed(self, hub: HubSource, f: FileProgress, exc: DownloadFailed) -> None:
        """``hub`` failed a part of ``f``: tried after the others for a while; ``f``'s next request asks
        the next source's hub (not a link the failed one may have led to)."""
        self._penalties.failed(hub.key)
        f.url = None
        index = self._sources.index(hub) + 1
        log.info(
            "%s: source %d of %d failed (%s); trying the next", self.ticket.digest[:19], index, len(self._sources), exc
        )

    def _fetch_from(
        self, hub: HubSource, f: FileProgress, cursor: list, end: int, view: memoryview, seg=None, sink=None
    ) -> None:
        """Fetch ``[cursor[0], end)`` of ``f`` from ``hub``, retrying stalls and drops from the last
        written byte; ``cursor[0]`` follows the first byte not written."""
        drops = statuses = 0
        while cursor[0] < _end(end, seg) and not self._stop.is_set():
            try:
                cursor[0] = self._attempt(hub, f, cursor[0], _end(end, seg), view, seg, sink)
            except _Retry as exc:
                if exc.pos is not None:
                    cursor[0] = max(cursor[0], exc.pos)
                drops += 1
                self._stop.wait(self._drop_wait(f, exc, drops))
            except _HubStatus as exc:
                statuses += 1
                self._stop.wait(self._status_wait(exc, statuses))

    def _drop_wait(self, f: FileProgress, exc: _Retry, drops: int) -> float:
        """The pause before the retry after the ``drops``-th stall or drop; fails past the retries."""
        if drops > self.settings.range_retries:
            message = f"{f.file.path}: giving up after {drops} attempts: {exc}"
            raise DownloadFailed(SOURCE_UNAVAILABLE, message) from None
        self._stat("retries")
        return min(0.25 * 2 ** (drops - 1), 5.0)

    def _status_wait(self, exc: _HubStatus, statuses: int) -> float:
        """The pause before the retry after the ``statuses``-th 5xx/429; fails past the retries or
        when the hub asks for a longer wait than allowed."""
        wait = exc.retry_after if exc.retry_after is not None else min(2.0 ** (statuses - 1), 8.0)
        settings = self.settings
        if statuses > settings.http_retries or wait > settings.http_retry_max_wait:
            raise DownloadFailed(SOURCE_UNAVAILABLE, str(exc), retry_after=exc.retry_after) from None
        self._stat("retries")
        return wait

    # ---------------------------------------------------------------- one request

    def _attempt(
        self, hub: HubSource, f: FileProgress, pos: int, end: int, view: memoryview, seg=None, sink=None
    ) -> int:
        """One request for ``[pos, end)`` to ``hub``; returns the position reached (``end`` on success)."""
        if hub.packed(f.file) is not None:  # only peers serve it by range (``layers``)
            message = f"{f.file.path}: inside a compressed layer, which the registry serves only whole"
            raise DownloadFailed(SOURCE_UNAVAILABLE, f"{message}: the next attempt reads the layer")
        response = self._open(hub, f, pos, end)
        with self._active_lock:
            self._active.add(response)
        reuse = False
        cursor = [pos]  # the first byte not written yet, kept current by _read_body
        try:
            skip, stop = _body_span(f, response, pos, end, hub.extent(f.file))
            self._skip(response, skip, view)
            pos = self._read_body(f, response, cursor, stop, view, seg, sink)
            reuse = pos == end and response.length == 0
            return pos
        except (OSError, http.client.HTTPException) as exc:  # the network's: the disk's are DiskError
            if self._stop.is_set():
                return cursor[0]
            raise _Retry(_lost(f, exc, cursor[0]), cursor[0]) from None
        finally:
            with self._active_lock:
                self._active.discard(response)
            response.close(reuse=reuse)

    def _open(self, hub: HubSource, f: FileProgress, pos: int, end: int) -> StreamedResponse:
        """A response for ``bytes=pos-(end-1)`` of ``f`` from ``hub``, redirects followed, status checked."""
        for cached in (f.url, None):
            url = cached or hub.url(f.file)
            sent = self._credentials(hub)
            response = self._request(hub, f, url, pos, end, sent)
            if response.status == 401 and hub.source == OCI and self._challenge_answered(hub, response, sent):
                response = self._request(hub, f, url, pos, end, self._credentials(hub))
            if response.status in (200, 206):
                # Later parts go straight to where the redirect led (the CDN), not via the hub.
                f.url = response.url if origin(response.url) != origin(hub.endpoint) else None
                return response
            if cached and file_reason(response.status) == ACCESS_DENIED:
                _error_detail(response)
                f.url = None  # an expired or revoked CDN link: ask the hub again
                continue
            raise _status_error(f, response, pos, end)
        raise DownloadFailed(ACCESS_DENIED, f"{f.file.path}: the hub refused the download")

    def _credentials(self, hub: HubSource) -> dict[str, str]:
        """What goes to ``hub``'s origin: its headers, or what a registry's challenge was answered with."""
        return self._auth.headers(hub) if hub.source == OCI else hub.hub_headers()

    def _challenge_answered(self, hub: HubSource, response: StreamedResponse, sent: dict) -> bool:
        """A registry's 401 (from its own origin): True once there is a new credential to send (the
        answer was drained), False to take the 401 as it is."""
        if origin(response.url) != origin(hub.endpoint):
            return False
        try:
            answered = self._auth.answer(hub, response.header("WWW-Authenticate"), sent)
        except DownloadFailed:
            response.close(reuse=False)
            raise
        if answered:
            response.drain_small()
        return answered

    def _request(
        self, hub: HubSource, f: FileProgress, url: str, pos: int, end: int, credentials: dict
    ) -> StreamedResponse:
        offset = hub.extent(f.file)[0]  # a file inside a blob: its bytes from there on
        try:
            response = self._pool.get(
                url,
                credentials=credentials,
                credentials_origin=origin(hub.endpoint),
                headers={"Range": f"bytes={pos + offset}-{end - 1 + offset}"},
            )
        except HttpError as exc:
            if not exc.retryable:
                raise DownloadFailed(SOURCE_UNAVAILABLE, f"{f.file.path}: {exc}") from None
            raise _Retry(str(exc)) from None
        self._stat("requests")
        return response

    # ---------------------------------------------------------------- the body

    def _skip(self, response: StreamedResponse, skip: int, view: memoryview) -> None:
        """Read and drop the first ``skip`` bytes of the body (a 200 answer to a range request)."""
        rate, size = self._rate, len(view)
        while skip > 0:
            n = rate.chunk(min(size, skip))
            rate.acquire(n, self._stop.is_set)
            got = response.readinto(view[:n])
            if got <= 0:
                raise http.client.IncompleteRead(b"")
            skip -= got

    def _read_body(
        self,
        f: FileProgress,
        response: StreamedResponse,
        cursor: list,
        stop: int,
        view: memoryview,
        seg=None,
        sink=None,
    ) -> int:
        """Read the body up to ``stop``, writing each read at its offset and hashing it (or handing it to
        ``sink``); ``cursor[0]`` follows the first byte not written. Returns where it stopped (``stop``
        unless cancelled)."""
        rate, cancelled, size = self._rate, self._stop.is_set, len(view)
        write_at, record = disk.write_at, self._frontier.record
        fd = f.open() if sink is None else -1
        pos = start = cursor[0]
        try:
            while pos < stop and not cancelled():
                n = rate.chunk(min(size, stop - pos))
                if seg is not None:
                    stop, n = _claim(seg, pos, n)
                    if n <= 0:
                        break
                if not rate.acquire(n, cancelled):
                    break
                got = response.readinto(view[:n])
                if got <= 0:
                    raise http.client.IncompleteRead(b"", stop - pos)
                chunk = view[:got]
                if sink is not None:
                    sink(chunk, pos)
                    pos = cursor[0] = pos + got
                    continue
                write_at(fd, chunk, pos)
                pos += got  # received and written, even if hashing them fails the file
                cursor[0] = pos
                record(f, pos - got, pos, chunk)
        finally:
            self._count(pos - start)
        return pos

    def _count(self, moved: int) -> None:
        if moved:
            self._stat("network_bytes", moved)
            if self._on_bytes is not None:
                self._on_bytes(moved)
