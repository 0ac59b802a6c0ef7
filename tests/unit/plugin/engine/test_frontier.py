"""The hash frontier on one thread: bytes hashed from the writer's buffer when they are at the frontier,
read back from disk when they arrived ahead of it, the file's digest checked at its end."""

from __future__ import annotations

import hashlib

import pytest

from gpustack_models.plugin.engine.failures import INTEGRITY_MISMATCH, DownloadFailed
from gpustack_models.plugin.engine.frontier import HashFrontier
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.sources.manifest import ManifestFile

DATA = bytes(range(256)) * 40  # 10 KiB


class Counts:
    def __init__(self):
        self.hashed = self.reread = self.completed = 0

    def frontier(self) -> HashFrontier:
        return HashFrontier(on_hashed=self._hashed, on_reread=self._reread, on_complete=self._complete)

    def _hashed(self, n: int) -> None:
        self.hashed += n

    def _reread(self, n: int) -> None:
        self.reread += n

    def _complete(self) -> None:
        self.completed += 1


def progress(tmp_path, data: bytes, *, algorithm: str = "sha256", hexdigest: str | None = None) -> FileProgress:
    if hexdigest is None:
        header = b"blob %d\0" % len(data) if algorithm == "gitsha1" else b""
        hexdigest = (hashlib.sha1 if algorithm == "gitsha1" else hashlib.sha256)(header + data).hexdigest()
    f = FileProgress(ManifestFile("model.bin", len(data), algorithm, hexdigest), tmp_path / "model.bin")
    f.new_hash()
    return f


def write(f: FileProgress, data: bytes, start: int, end: int) -> memoryview:
    """``data[start:end]`` written to the partial file, as a writer does before recording it."""
    with open(f.path, "r+b" if f.path.exists() else "wb") as out:
        out.seek(start)
        out.write(data[start:end])
    return memoryview(data)[start:end]


@pytest.mark.parametrize("algorithm", ["sha256", "gitsha1"])
def test_it_hashes_bytes_written_in_order_from_the_writers_buffer(tmp_path, algorithm):
    f, counts = progress(tmp_path, DATA, algorithm=algorithm), Counts()
    frontier = counts.frontier()
    for start in range(0, len(DATA), 4096):
        end = min(len(DATA), start + 4096)
        frontier.record(f, start, end, write(f, DATA, start, end))

    assert (f.complete, f.hashed, f.hexdigest) == (True, len(DATA), f.file.hexdigest)
    assert (counts.hashed, counts.reread, counts.completed) == (len(DATA), 0, 1)


def test_it_reads_back_the_bytes_that_arrived_ahead_of_the_frontier(tmp_path):
    f, counts = progress(tmp_path, DATA), Counts()
    frontier = counts.frontier()
    frontier.record(f, 6000, len(DATA), write(f, DATA, 6000, len(DATA)))
    assert (f.hashed, counts.hashed) == (0, 0)  # waits for the bytes before it

    frontier.record(f, 0, 6000, write(f, DATA, 0, 6000))

    assert f.complete and f.hexdigest == hashlib.sha256(DATA).hexdigest()
    assert (counts.hashed, counts.reread, counts.completed) == (len(DATA), len(DATA) - 6000, 1)


def test_it_fails_a_file_whose_bytes_do_not_hash_to_the_manifests(tmp_path):
    f, counts = progress(tmp_path, DATA), Counts()
    bad = bytearray(DATA)
    bad[5000] ^= 1

    with pytest.raises(DownloadFailed) as caught:
        counts.frontier().record(f, 0, len(bad), write(f, bytes(bad), 0, len(bad)))

    assert caught.value.reason == INTEGRITY_MISMATCH
    assert f.file.hexdigest in caught.value.message
    assert (f.bad, f.complete, f.hexdigest, counts.completed) == (True, False, None, 0)


def test_it_completes_an_empty_file_without_a_byte(tmp_path):
    f, counts = progress(tmp_path, b""), Counts()
    counts.frontier().advance(f)
    assert f.complete and f.hexdigest == hashlib.sha256(b"").hexdigest() and counts.completed == 1


def test_it_fails_when_recorded_bytes_are_not_on_disk(tmp_path):
    f, counts = progress(tmp_path, DATA), Counts()
    write(f, DATA, 0, 100)  # the file holds 100 bytes, the ranges claim 200
    with f.lock:
        f.add_range(0, 200)
    with pytest.raises(DownloadFailed) as caught:
        counts.frontier().advance(f)
    assert caught.value.reason == INTEGRITY_MISMATCH and "vanished at 100" in caught.value.message
    f.close(sync=False)


def test_it_hashes_resumed_bytes_from_disk_before_the_ones_just_written(tmp_path):
    f, counts = progress(tmp_path, DATA), Counts()
    write(f, DATA, 0, 4000)
    with f.lock:
        f.add_range(0, 4000)  # resumed from a checkpoint whose hash state could not be restored

    counts.frontier().record(f, 4000, len(DATA), write(f, DATA, 4000, len(DATA)))

    assert f.complete and f.hexdigest == hashlib.sha256(DATA).hexdigest()
    assert (counts.hashed, counts.reread) == (len(DATA), len(DATA))  # the writer's bytes were not at the frontier
    f.close(sync=False)


def failed_once(tmp_path):
    """A file written whole with one byte flipped (at 5000), which failed its hash at the frontier."""
    f, counts = progress(tmp_path, DATA), Counts()
    frontier = counts.frontier()
    bad = bytearray(DATA)
    bad[5000] ^= 1
    with pytest.raises(DownloadFailed):
        frontier.record(f, 0, len(DATA), write(f, bytes(bad), 0, len(DATA)))
    return f, counts, frontier


def test_a_bad_file_is_hashed_no_further_until_its_bytes_are_replaced_and_it_is_hashed_again(tmp_path):
    f, counts, frontier = failed_once(tmp_path)
    frontier.advance(f)  # another thread at the frontier (a checkpoint): no second failure
    assert f.bad and not f.complete

    write(f, DATA, 4096, 8192)  # the bytes a second source sent instead
    frontier.rehash(f)

    assert (f.bad, f.complete, f.hexdigest) == (False, True, f.file.hexdigest)
    assert (counts.hashed, counts.reread, counts.completed) == (len(DATA), len(DATA), 1)


def test_a_file_hashed_again_with_a_bad_byte_left_stays_bad(tmp_path):
    f, counts, frontier = failed_once(tmp_path)

    with pytest.raises(DownloadFailed) as failed:
        frontier.rehash(f)

    assert failed.value.reason == INTEGRITY_MISMATCH and f.bad and not f.complete
    assert counts.completed == 0
