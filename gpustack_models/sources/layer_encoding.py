"""Compressed tar layers: which encoding a layer's media type names, and reading one decompressed.

Registries get compressed layers from every image builder (buildah, podman and docker compress each layer
they push, gzip by default, zstd on request), and KitOps ModelKits and ModelPack artifacts may compress
theirs. A compressed layer has no byte offsets of its files to fetch by range: its bytes are read as one
stream from the start, decompressed, and a file's bytes are the ``size`` bytes at its offset in the
decompressed tar stream.

``Decoder`` decompresses any number of concatenated gzip members or zstd frames (``pigz`` and zstd's
multi-threaded encoder write several). ``DecodingReader`` reads the decompressed stream of a blob from a
``fetch(start)`` that answers the blob's bytes from ``start`` on: a connection that drops mid-stream is asked
again from the first compressed byte not yet read, and the decompressor carries on where it was, so a
dropped connection costs no byte read twice. zstd needs the ``zstandard`` package, imported only when a zstd
layer is read.
"""

from __future__ import annotations

import http.client
import io
import zlib
from collections.abc import Callable

GZIP, ZSTD = "gzip", "zstd"
ENCODINGS = ("", GZIP, ZSTD)  # "": an uncompressed tar
_TAR_SUFFIXES = {
    ".tar": "",
    ".tar+gzip": GZIP,
    ".tar.gzip": GZIP,
    ".tar.gz": GZIP,
    ".tar+zstd": ZSTD,
    ".tar.zstd": ZSTD,
    ".tar.zst": ZSTD,
}
_DOCKER = {
    "application/vnd.docker.image.rootfs.diff.tar": "",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": GZIP,
    "application/vnd.docker.image.rootfs.diff.tar.zstd": ZSTD,
}
CHUNK = 1024 * 1024


class DecodeError(ValueError):
    """The bytes are not what the encoding says (corrupt, truncated, another format)."""


def encoding_of(media_type: str) -> str | None:
    """The encoding of a tar layer of ``media_type`` (``""`` uncompressed, ``gzip``, ``zstd``); ``None`` if it
    is not a tar layer."""
    if media_type in _DOCKER:
        return _DOCKER[media_type]
    for suffix, encoding in _TAR_SUFFIXES.items():
        if media_type.endswith(suffix):
            return encoding
    return None


def _decompressor(encoding: str):
    if encoding == GZIP:
        return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    if encoding == ZSTD:
        import zstandard  # only a node or worker that meets a zstd layer loads it

        return zstandard.ZstdDecompressor().decompressobj()
    raise DecodeError(f"no decoder for {encoding!r}")


class Decoder:
    """Decompresses a stream of concatenated gzip members or zstd frames, fed in pieces."""

    def __init__(self, encoding: str):
        self.encoding = encoding
        self._current = _decompressor(encoding)
        self._fresh = True  # nothing fed to the current member yet

    def feed(self, data: bytes) -> bytes:
        out = []
        while data:
            try:
                out.append(self._current.decompress(data))
            except Exception as exc:  # zlib.error, zstandard.ZstdError
                raise DecodeError(f"not a valid {self.encoding} stream: {exc}") from None
            self._fresh = False
            if not self._current.eof:
                break
            data = self._current.unused_data  # the next member, or the padding a tar writer left
            self._current, self._fresh = _decompressor(self.encoding), True
        return b"".join(out)

    @property
    def between_members(self) -> bool:
        """The stream may end here: the last member ended (nothing of another fed)."""
        return self._fresh


class DecodingReader(io.RawIOBase):
    """The decompressed bytes of a blob of ``size`` compressed bytes, read through ``fetch(start)`` (an object
    with ``readinto`` and ``close`` giving the blob's bytes from ``start`` on). A read that fails with
    ``OSError`` or ``http.client.HTTPException`` is retried from where it was, at most ``retries`` times in a
    row (``on_retry(exc, attempt)`` before each: it may wait, or raise to stop). ``allow(n)``, before each read
    of at most ``n`` compressed bytes, returns how many may be read now (a rate limiter waits there);
    ``on_bytes(n)`` hears of each ``n`` compressed bytes read."""

    def __init__(
        self,
        encoding: str,
        size: int,
        fetch: Callable[[int], object],
        *,
        retries: int = 5,
        on_retry: Callable[[BaseException, int], None] | None = None,
        allow: Callable[[int], int] | None = None,
        on_bytes: Callable[[int], None] | None = None,
        chunk: int = CHUNK,
    ):
        self._decoder = Decoder(encoding)
        self._size, self._fetch, self._retries = size, fetch, retries
        self._on_retry, self._allow, self._on_bytes = on_retry, allow, on_bytes
        self._buffer = memoryview(bytearray(chunk))
        self._stream = None
        self.position = 0  # compressed bytes read so far
        self.produced = 0  # decompressed bytes handed out
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            if self.position >= self._size:
                if not self._decoder.between_members:
                    raise DecodeError(f"the {self._decoder.encoding} stream ends inside a member")
                return 0
            self._pending = memoryview(self._decoder.feed(self._read_compressed()))
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        self.produced += n
        return n

    def skip(self, n: int) -> None:
        """Read and drop ``n`` decompressed bytes; ``EOFError`` if the stream ends first."""
        while n > 0:
            if not self._pending:
                if self.position >= self._size:
                    raise EOFError("the layer ends before the file's bytes")
                self._pending = memoryview(self._decoder.feed(self._read_compressed()))
                continue
            step = min(n, len(self._pending))
            self._pending = self._pending[step:]
            self.produced += step
            n -= step

    def _read_compressed(self) -> memoryview:
        want = min(len(self._buffer), self._size - self.position)
        if self._allow is not None:
            want = self._allow(want)
        failures = 0
        while True:
            try:
                if self._stream is None:
                    self._stream = self._fetch(self.position)
                got = self._stream.readinto(self._buffer[:want])
                if not got:
                    raise ConnectionResetError(f"the blob ended at byte {self.position} of {self._size}")
                break
            except (OSError, http.client.HTTPException) as exc:
                self._close_stream()
                failures += 1
                if failures > self._retries:
                    raise
                if self._on_retry is not None:
                    self._on_retry(exc, failures)
        self.position += got
        if self._on_bytes is not None:
            self._on_bytes(got)
        return self._buffer[:got]  # decompressed before the next read reuses the buffer

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass

    def close(self) -> None:
        self._close_stream()
        super().close()
