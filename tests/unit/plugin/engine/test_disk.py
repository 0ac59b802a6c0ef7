"""The partial files' disk operations: a full volume and a failing one told apart, every ``OSError`` on
the way out as a ``DiskError`` (never mistaken for the network's), and the reads and writes at offsets."""

from __future__ import annotations

import errno
import os

import pytest

from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.disk import DiskError, disk_failure
from gpustack_models.plugin.engine.failures import INSUFFICIENT_CAPACITY, SOURCE_UNAVAILABLE


@pytest.mark.parametrize(
    "code, reason",
    [
        (errno.ENOSPC, INSUFFICIENT_CAPACITY),
        (errno.EDQUOT, INSUFFICIENT_CAPACITY),
        (errno.EIO, SOURCE_UNAVAILABLE),
        (errno.EROFS, SOURCE_UNAVAILABLE),
    ],
    ids=["full", "over-quota", "io-error", "read-only"],
)
def test_it_maps_a_full_volume_to_insufficient_capacity_and_any_other_error_to_unavailable(code, reason):
    error = OSError(code, os.strerror(code))
    assert disk_failure(DiskError(error)).reason == reason
    assert disk_failure(error).reason == reason  # a bare OSError maps alike
    assert os.strerror(code) in disk_failure(error).message


def test_it_writes_and_reads_back_at_offsets_creating_the_directories(tmp_path):
    path = tmp_path / "partial" / "tree" / "dir" / "model.bin"
    fd = disk.open_file(path)
    try:
        disk.write_at(fd, memoryview(b"world"), 6)
        disk.write_at(fd, memoryview(b"hello "), 0)
        buffer = bytearray(16)
        assert disk.read_at(fd, memoryview(buffer), 0) == 11
        assert bytes(buffer[:11]) == b"hello world"
        assert disk.read_at(fd, memoryview(buffer), 11) == 0  # the end of the file
    finally:
        disk.close_file(fd, sync=True)
    assert disk.size_on_disk(path) == 11
    assert disk.size_on_disk(tmp_path / "missing") == -1


def test_every_failure_comes_out_as_a_disk_error_with_its_errno(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    with pytest.raises(DiskError):
        disk.open_file(blocker / "below" / "model.bin")  # a directory where a file is
    with pytest.raises(DiskError) as caught:
        disk.size_on_disk(blocker / "model.bin")
    assert caught.value.errno == errno.ENOTDIR

    read_only = os.open(blocker, os.O_RDONLY)
    try:
        with pytest.raises(DiskError) as caught:
            disk.write_at(read_only, memoryview(b"y"), 0)
        assert caught.value.errno == errno.EBADF
        assert isinstance(caught.value.error, OSError)
    finally:
        os.close(read_only)
    with pytest.raises(DiskError) as caught:
        disk.close_file(-1, sync=True)  # no such descriptor: the sync fails, the close too
    assert caught.value.errno == errno.EBADF
    with pytest.raises(DiskError):
        disk.read_at(-1, memoryview(bytearray(1)), 0)
