"""Compressed tar layers: which encoding a layer's media type names, and reading one decompressed.

Registries get compressed layers from every image builder (buildah, podman and docker compress each layer
they push, gzip by default, zstd on request), and KitOps ModelKits and ModelPack artifacts may compress
theirs. A compressed layer has no byte offsets of its files to fetch by range: its bytes are read as one
stream from the start, decompressed, and a file's bytes are the ``size`` bytes at its offset in the
decompressed tar stream.

``DecodingReader`` decompresses any number of concatenated gzip members or zstd frames (``pigz`` and zstd's
multi-threaded encoder write several), never more than a read's worth at a time, and refuses a stream that
expands past ``MAX_RATIO``. It reads the blob through a ``fetch(start)`` that answers the blob's bytes from
``start`` on: a connection that drops mid-stream is asked again from the first compressed byte not yet read,
and the decompressor carries on where it was, so a dropped connection costs no byte read twice. zstd needs
the ``zstandard`` package, imported only when a zstd layer is read.
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
# Decompressed bytes at most this many times the compressed bytes read (plus a mebibyte): deflate cannot expand
# more than about 1,032 times, model files far less; zstd can expand without bound (a small blob of a terabyte
# of zeros would keep a worker reading for hours).
MAX_RATIO = 1100


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


class _Compressed(io.RawIOBase):
    """The ``size`` compressed bytes of a blob through ``fetch(start)``, a dropped read asked again from where it
    was (see ``DecodingReader``)."""

    def __init__(self, size: int, fetch, retries: int, on_retry, allow, on_bytes):
        self.size, self._fetch, self._retries = size, fetch, retries
        self._on_retry, self._allow, self._on_bytes = on_retry, allow, on_bytes
        self._stream = None
        self.position = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        want = min(len(buffer), self.size - self.position)
        if want <= 0:
            return 0
        if self._allow is not None:
            want = self._allow(want)
        failures = 0
        while True:
            try:
                if self._stream is None:
                    self._stream = self._fetch(self.position)
                got = self._stream.readinto(memoryview(buffer)[:want])
                if not got:
                    raise ConnectionResetError(f"the blob ended at byte {self.position} of {self.size}")
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close_stream()
                failures += 1
                if failures > self._retries:
                    raise
                if self._on_retry is not None:
                    self._on_retry(exc, failures)
        self.position += got
        if self._on_bytes is not None:
            self._on_bytes(got)
        return got

    def close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


class _Gzip:
    """Concatenated gzip members, decompressed at most a buffer's worth at a time (zero padding after a member
    ignored, as gzip(1) does)."""

    def __init__(self, raw: _Compressed, chunk: int):
        self._raw, self._buffer = raw, bytearray(chunk)
        self._inflate, self._tail, self._fresh = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS), b"", True

    def readinto(self, buffer) -> int:
        while True:
            if self._fresh:
                self._tail = self._tail.lstrip(b"\0")
            if not self._tail:
                got = self._raw.readinto(self._buffer)
                if not got:
                    if not self._fresh:
                        raise DecodeError("the gzip stream ends inside a member")
                    return 0
                self._tail = bytes(self._buffer[:got])
                continue
            try:
                out = self._inflate.decompress(self._tail, len(buffer))
            except zlib.error as exc:
                raise DecodeError(f"not a valid gzip stream: {exc}") from None
            self._fresh = False
            if self._inflate.eof:
                self._tail, self._fresh = self._inflate.unused_data, True
                self._inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            else:
                self._tail = self._inflate.unconsumed_tail
            if out:
                buffer[: len(out)] = out
                return len(out)


class _Zstd:
    """Concatenated zstd frames, through zstandard's stream reader (its output bounded by each read's size)."""

    def __init__(self, raw: _Compressed, chunk: int):
        import zstandard  # only a node or worker that meets a zstd layer loads it

        self._error = zstandard.ZstdError
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            raw, read_size=chunk, read_across_frames=True, closefd=False
        )

    def readinto(self, buffer) -> int:
        try:
            return self._reader.readinto(buffer)
        except self._error as exc:
            raise DecodeError(f"not a valid zstd stream: {exc}") from None


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
        if encoding not in (GZIP, ZSTD):
            raise DecodeError(f"no decoder for {encoding!r}")
        self._raw = _Compressed(size, fetch, retries, on_retry, allow, on_bytes)
        self._decoded = (_Gzip if encoding == GZIP else _Zstd)(self._raw, chunk)
        self._scratch: memoryview | None = None
        self.produced = 0  # decompressed bytes handed out

    @property
    def position(self) -> int:
        """Compressed bytes read so far."""
        return self._raw.position

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._decoded.readinto(buffer)
        self.produced += n
        if self.produced > MAX_RATIO * self._raw.position + CHUNK:
            raise DecodeError(f"it expands more than {MAX_RATIO} times (a decompression bomb, not a model)")
        return n

    def skip(self, n: int) -> None:
        """Read and drop ``n`` decompressed bytes; ``EOFError`` if the stream ends first."""
        if self._scratch is None:
            self._scratch = memoryview(bytearray(CHUNK))
        while n > 0:
            got = self.readinto(self._scratch[: min(n, len(self._scratch))])
            if got <= 0:
                raise EOFError("the layer ends before the file's bytes")
            n -= got

    def close(self) -> None:
        self._raw.close_stream()
        super().close()
