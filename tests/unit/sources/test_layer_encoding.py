"""Compressed layers read as one decompressed stream: several gzip members or zstd frames, a dropped read asked
again from the compressed byte it reached (the decompressor going on), a stream cut short or of another format
refused."""

from __future__ import annotations

import gzip
import io
import os

import pytest
import zstandard

from gpustack_models.sources.layer_encoding import DecodeError, DecodingReader, encoding_of

DATA = os.urandom(300_000) + b"\0" * 200_000


def gzip_members(data: bytes, pieces: int) -> bytes:
    step = -(-len(data) // pieces)
    return b"".join(gzip.compress(data[i : i + step]) for i in range(0, len(data), step))


def zstd_frames(data: bytes, pieces: int) -> bytes:
    step, compressor = -(-len(data) // pieces), zstandard.ZstdCompressor()
    return b"".join(compressor.compress(data[i : i + step]) for i in range(0, len(data), step))


class Flaky:
    """``fetch(start)`` of a blob whose connection drops after ``drop_after`` bytes, ``drops`` times."""

    def __init__(self, blob: bytes, drop_after: int, drops: int):
        self.blob, self.drop_after, self.drops = blob, drop_after, drops
        self.starts: list[int] = []

    def __call__(self, start: int):
        self.starts.append(start)
        return _Reader(self, self.blob[start:])


class _Reader(io.RawIOBase):
    def __init__(self, owner: Flaky, data: bytes):
        self.owner, self.data, self.sent = owner, data, 0

    def readinto(self, buffer) -> int:
        if self.owner.drops and self.sent >= self.owner.drop_after:
            self.owner.drops -= 1
            raise ConnectionResetError("dropped")
        n = min(len(buffer), len(self.data) - self.sent, 7000)
        buffer[:n] = self.data[self.sent : self.sent + n]
        self.sent += n
        return n


def read_all(reader: DecodingReader) -> bytes:
    out, view = bytearray(), memoryview(bytearray(50_000))
    while got := reader.readinto(view):
        out += view[:got]
    return bytes(out)


@pytest.mark.parametrize(
    ("encoding", "blob"),
    [("gzip", gzip.compress(DATA)), ("gzip", gzip_members(DATA, 3)), ("zstd", zstd_frames(DATA, 4))],
)
def test_every_member_or_frame_comes_out_in_order(encoding, blob):
    reader = DecodingReader(encoding, len(blob), Flaky(blob, 0, 0))
    assert read_all(reader) == DATA
    assert reader.position == len(blob) and reader.produced == len(DATA)


def test_a_dropped_read_is_asked_again_from_the_compressed_byte_it_reached():
    blob = gzip_members(DATA, 2)
    fetch, retries = Flaky(blob, drop_after=21_000, drops=3), []
    reader = DecodingReader("gzip", len(blob), fetch, retries=3, on_retry=lambda exc, n: retries.append(n))
    assert read_all(reader) == DATA
    assert retries == [1, 1, 1]  # each a first drop in a row: every connection made progress
    assert fetch.starts == [0, 21_000, 42_000, 63_000]
    assert reader.position == len(blob)  # no compressed byte read twice


def test_more_drops_in_a_row_than_allowed_raise_the_last():
    blob = gzip.compress(DATA)
    fetch = Flaky(blob, drop_after=0, drops=10)
    with pytest.raises(ConnectionResetError):
        read_all(DecodingReader("gzip", len(blob), fetch, retries=2))
    assert len(fetch.starts) == 3


def test_allow_limits_each_compressed_read_and_on_bytes_counts_them():
    blob, asked, counted = zstd_frames(DATA, 2), [], []

    def allow(n: int) -> int:
        asked.append(n)
        return min(n, 4096)

    reader = DecodingReader("zstd", len(blob), Flaky(blob, 0, 0), allow=allow, on_bytes=counted.append)
    assert read_all(reader) == DATA
    assert max(counted) <= 4096 and sum(counted) == len(blob) and len(asked) == len(counted)


def test_skip_reads_past_decompressed_bytes_across_members():
    blob = gzip_members(DATA, 5)
    reader = DecodingReader("gzip", len(blob), Flaky(blob, 0, 0))
    reader.skip(250_001)
    view = memoryview(bytearray(10))
    assert reader.readinto(view) == 10 and bytes(view) == DATA[250_001:250_011]
    with pytest.raises(EOFError):
        reader.skip(len(DATA))


@pytest.mark.parametrize(
    ("encoding", "blob"),
    [
        ("gzip", gzip.compress(DATA)[:-1000]),  # cut short
        ("gzip", zstd_frames(DATA, 1)),  # another format
        ("zstd", b"\x28\xb5\x2f\xfd" + os.urandom(5000)),  # a frame header, then noise
    ],
)
def test_a_stream_cut_short_or_not_of_its_encoding_is_refused(encoding, blob):
    with pytest.raises(DecodeError):
        read_all(DecodingReader(encoding, len(blob), Flaky(blob, 0, 0)))


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_stream_that_expands_past_the_ratio_is_refused_early(encoding):
    zeros = b"\0" * (64 * 1024 * 1024)
    blob = zstd_frames(zeros, 1) if encoding == "zstd" else gzip.compress(zeros, compresslevel=9)
    reader = DecodingReader(encoding, len(blob), Flaky(blob, 0, 0))
    if encoding == "gzip":  # deflate's ceiling is about 1,032 times: within the bound
        assert read_all(reader) == zeros
        return
    with pytest.raises(DecodeError, match="expands more than 1100 times"):
        read_all(reader)
    assert reader.produced <= 1100 * reader.position + 1024 * 1024 + 50_000  # the bound and one read past it


def test_zero_padding_after_a_gzip_member_is_ignored_as_gzip_does():
    blob = gzip.compress(DATA) + b"\0" * 3000
    assert read_all(DecodingReader("gzip", len(blob), Flaky(blob, 0, 0))) == DATA


def test_no_read_returns_more_than_asked_however_much_a_frame_expands():
    blob = zstd_frames(b"\0" * 8_000_000, 1)  # a few hundred bytes
    reader, view = DecodingReader("zstd", len(blob), Flaky(blob, 0, 0)), memoryview(bytearray(4096))
    assert reader.readinto(view) == 4096


@pytest.mark.parametrize(
    ("media_type", "encoding"),
    [
        ("application/vnd.oci.image.layer.v1.tar", ""),
        ("application/vnd.oci.image.layer.v1.tar+gzip", "gzip"),
        ("application/vnd.oci.image.layer.v1.tar+zstd", "zstd"),
        ("application/vnd.docker.image.rootfs.diff.tar.gzip", "gzip"),
        ("application/vnd.docker.image.rootfs.diff.tar.zstd", "zstd"),
        ("application/vnd.cncf.model.weight.v1.tar+gzip", "gzip"),
        ("application/vnd.kitops.modelkit.model.v1.tar+gzip", "gzip"),
        ("application/vnd.cncf.model.weight.v1.raw", None),
        ("application/octet-stream", None),
    ],
)
def test_the_encoding_a_media_type_names(media_type, encoding):
    assert encoding_of(media_type) == encoding
