"""Files inside a compressed tar layer of a registry source: one decompressed stream of the layer writes them.

A gzip or zstd layer (what buildah, podman and docker push) has no offsets of its files to fetch by range.
When the ticket's first source holds files in such a layer (``HubSource.packed``) and no peer holds the digest
``Ready``, the download reads each such layer once from its start (``LayerStream``: a thread per layer, taking
a connection slot as a part does). Decompressed, its tar stream is read past to each wanted file's offset
(files in offset order; files at the same offset, hard links, written from the same bytes) and the file's
bytes are written and hashed as a part's are; bytes a file already has (an earlier attempt's, restored from
the checkpoint) are read past, not written again. A connection that drops mid-layer is asked again from the
first compressed byte not read, the decompressor carrying on (``DecodingReader``); a new attempt reads the
layer from its start again. The layer's blob is read only as far as its last wanted file.

With a ``Ready`` peer the files are fetched from peers by range as any file. A part no peer serves then fails the
attempt (``RangeFetcher``: the registry serves the layer only whole), and the next attempt reads the layers
from the registry whatever its peers (``layers_first``, after a failure): one read of each layer, never one
per part.

Compressed bytes count as the download's network bytes and take the node's rate limiter; progress is the
decompressed bytes written and hashed.
"""

from __future__ import annotations

import bisect
import http.client
import re
import threading
from dataclasses import dataclass, field

from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.failures import INTEGRITY_MISMATCH, SOURCE_UNAVAILABLE, DownloadFailed
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.ticket import OCI, FetchTicket, HubSource, origin, usable_peers
from gpustack_models.plugin.engine.transport import HttpError, StreamedResponse
from gpustack_models.sources.hub_errors import error_code_detail, file_reason, transient
from gpustack_models.sources.layer_encoding import DecodeError, DecodingReader

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class _Stopped(Exception):
    """The download stopped while a layer was being read."""


@dataclass
class Layer:
    """A compressed layer of ``hub`` and the files to write from it: ``groups`` of files at the same offset
    of its tar stream, by offset."""

    hub: HubSource
    blob: str
    size: int
    encoding: str
    groups: list[tuple[int, list[FileProgress]]] = field(default_factory=list)


def plan(ticket: FetchTicket, files: list[FileProgress], from_peers: bool) -> list[Layer]:
    """The compressed layers to read for the files left to fetch; none when ``from_peers`` and a peer holds the
    digest Ready (the files come from peers by range then)."""
    if from_peers and any(p.state == "Ready" for p in usable_peers(ticket.peers)):
        return []
    hub, layers, groups = ticket.sources[0], {}, {}
    for f in files:
        where = hub.packed(f.file) if hub.source == OCI and not (f.verified or f.complete) else None
        if where is not None:
            blob, offset, size, encoding = where
            layers.setdefault(blob, Layer(hub, blob, size, encoding))
            groups.setdefault((blob, offset, f.size), []).append(f)
    for (blob, offset, _), group in sorted(groups.items(), key=lambda item: item[0][1]):
        layers[blob].groups.append((offset, group))
    return list(layers.values())


def _open_blob(fetcher, hub: HubSource, blob: str, start: int, label: str) -> StreamedResponse:
    """The bytes of ``blob`` on ``hub`` from ``start`` on, the registry's challenge answered. A dropped
    connection or a 5xx/429 raises ``ConnectionError`` (to be asked again); any other refusal ``DownloadFailed``."""
    url, home = f"{hub.endpoint}/v2/{hub.repository}/blobs/{blob}", origin(hub.endpoint)
    headers = {"Range": f"bytes={start}-"}
    try:
        sent = fetcher._credentials(hub)
        response = fetcher._pool.get(url, credentials=sent, credentials_origin=home, headers=headers)
        if response.status == 401 and fetcher._challenge_answered(hub, response, sent):
            sent = fetcher._credentials(hub)
            response = fetcher._pool.get(url, credentials=sent, credentials_origin=home, headers=headers)
    except HttpError as exc:
        if not exc.retryable:
            raise DownloadFailed(SOURCE_UNAVAILABLE, f"{label}: {exc}") from None
        raise ConnectionError(str(exc)) from None
    fetcher._stat("requests")
    if response.status in (200, 206):
        return _at(response, start, label)
    detail = error_code_detail(response.header("X-Error-Code"))
    response.drain_small()
    message = f"{label}: GET {home[0]}://{home[1]}:{home[2]} answered HTTP {response.status}{detail}"
    if transient(response.status):
        raise ConnectionError(message)
    raise DownloadFailed(file_reason(response.status), message)


def _at(response: StreamedResponse, start: int, label: str) -> StreamedResponse:
    """``response`` positioned at byte ``start`` of the blob (a 200 answer's first bytes read past)."""
    if response.status == 206:
        m = _CONTENT_RANGE.fullmatch((response.header("Content-Range") or "").strip())
        if m is None or int(m.group(1)) != start:
            response.close(reuse=False)
            raise ConnectionError(f"{label}: unexpected Content-Range {response.header('Content-Range')!r}")
        return response
    scratch = memoryview(bytearray(64 * 1024))
    while start > 0:
        got = response.readinto(scratch[: min(start, len(scratch))])
        if got <= 0:
            response.close(reuse=False)
            raise ConnectionResetError(f"{label}: the blob ended before byte {start}")
        start -= got
    return response


class _Open:
    """An answer being read by a ``DecodingReader``: registered with the fetcher so ``abort`` reaches it, and
    closed without returning its connection (its body is rarely read to the end)."""

    def __init__(self, fetcher, response: StreamedResponse):
        self._fetcher, self._response = fetcher, response
        with fetcher._active_lock:
            fetcher._active.add(response)

    def readinto(self, buffer) -> int:
        return self._response.readinto(buffer)

    def close(self) -> None:
        with self._fetcher._active_lock:
            self._fetcher._active.discard(self._response)
        self._response.close(reuse=False)


def _reader(fetcher, hub: HubSource, blob: str, size: int, encoding: str, stop: threading.Event):
    """A ``DecodingReader`` of ``blob``: drops retried ``range_retries`` times with the fetcher's back-off, its
    compressed bytes taking the rate limiter and counted as network bytes."""
    label = f"layer {blob[:19]}"
    rate, settings = fetcher._rate, fetcher.settings

    def retry(exc: BaseException, attempt: int) -> None:
        fetcher._stat("retries")
        if stop.wait(min(0.25 * 2 ** (attempt - 1), 5.0)):
            raise _Stopped()

    def allow(n: int) -> int:
        n = rate.chunk(n)
        if not rate.acquire(n, stop.is_set):
            raise _Stopped()
        return n

    return DecodingReader(
        encoding,
        size,
        lambda start: _Open(fetcher, _open_blob(fetcher, hub, blob, start, label)),
        retries=settings.range_retries,
        on_retry=retry,
        allow=allow,
        on_bytes=fetcher._count,
        chunk=settings.buffer_size,
    )


def _failure(exc: BaseException, label: str, files: list[FileProgress]) -> DownloadFailed:
    if isinstance(exc, (DecodeError, EOFError)):
        for f in files:
            f.bad = True
        return DownloadFailed(INTEGRITY_MISMATCH, f"{label}: the registry's layer does not decompress: {exc}")
    message = f"{label}: giving up after dropped connections: {type(exc).__name__}: {exc}"
    return DownloadFailed(SOURCE_UNAVAILABLE, message)


class LayerStream:
    """Writes a ``Layer``'s files from one read of it (see the module's docstring)."""

    def __init__(self, fetcher, frontier, layer: Layer, stop: threading.Event):
        self._fetcher, self._frontier, self.layer, self._stop = fetcher, frontier, layer, stop

    def run(self, view: memoryview, slots) -> None:
        """Read the layer, holding one of the node's connection ``slots`` (a ``Limits.slots``) meanwhile."""
        if slots.acquire(self._stop.is_set):
            try:
                self._read(view)
            finally:
                slots.release()

    def _read(self, view: memoryview) -> None:
        layer, files = self.layer, []
        source = _reader(self._fetcher, layer.hub, layer.blob, layer.size, layer.encoding, self._stop)
        try:
            for offset, files in layer.groups:
                todo = [f for f in files if not (f.verified or f.complete) and f.missing()]
                if todo and not self._stop.is_set():
                    first = min(f.missing()[0][0] for f in todo)
                    source.skip(offset + first - source.produced)
                    self._write(todo, source, first, view)
        except _Stopped:
            return
        except (OSError, http.client.HTTPException, DecodeError, EOFError) as exc:
            if not self._stop.is_set():
                raise _failure(exc, f"layer {layer.blob[:19]}", files) from None
        finally:
            source.close()

    def _write(self, files: list[FileProgress], source: DecodingReader, pos: int, view: memoryview) -> None:
        size = files[0].size
        while pos < size and not self._stop.is_set():
            got = source.readinto(view[: min(len(view), size - pos)])
            if got <= 0:
                raise EOFError(f"the layer ends at byte {pos} of {files[0].file.path}")
            for f in files:
                self.put(f, view[:got], pos)
            pos += got

    def put(self, f: FileProgress, chunk: memoryview, pos: int) -> None:
        """Write the bytes of ``chunk`` (``f``'s from ``pos``) that ``f`` does not have yet, and hash them."""
        end, at = pos + len(chunk), pos
        while at < end:
            with f.lock:
                covered = f.covered_end(at)
                i = bisect.bisect_right(f.starts, at)
                upto = min(end, f.starts[i] if i < len(f.starts) else f.size)
            if covered > at:
                at = min(covered, end)
                continue
            piece = chunk[at - pos : upto - pos]
            disk.write_at(f.open(), piece, at)
            self._frontier.record(f, at, upto, piece)
            at = upto
