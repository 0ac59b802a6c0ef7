"""One file's progress: the written ranges kept disjoint and merged, what is still missing, the hash
frontier's view of them, and starting a file over."""

from __future__ import annotations

import hashlib

from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.sources.manifest import ManifestFile

SIZE = 100


def progress(tmp_path, size: int = SIZE) -> FileProgress:
    mf = ManifestFile("dir/model.bin", size, "sha256", hashlib.sha256(b"").hexdigest(), True)
    return FileProgress(mf, tmp_path / "tree" / "dir" / "model.bin")


def written(f: FileProgress, *ranges: tuple[int, int]) -> list[list[int]]:
    for start, end in ranges:
        f.add_range(start, end)
    return f.written_ranges()


def test_it_keeps_written_ranges_disjoint_merging_what_touches(tmp_path):
    f = progress(tmp_path)
    assert written(f, (40, 50), (10, 20)) == [[10, 20], [40, 50]]
    assert written(f, (20, 30)) == [[10, 30], [40, 50]]  # adjacent: one range
    assert written(f, (60, 70), (80, 90)) == [[10, 30], [40, 50], [60, 70], [80, 90]]
    assert written(f, (45, 85)) == [[10, 30], [40, 90]]  # spans several
    assert written(f, (12, 18)) == [[10, 30], [40, 90]]  # inside one
    assert written(f, (0, 100)) == [[0, 100]]
    assert f.written_bytes() == 100


def test_it_lists_what_is_missing_and_where_a_written_run_ends(tmp_path):
    f = progress(tmp_path)
    assert f.missing() == [(0, SIZE)]
    written(f, (10, 20), (30, 40))
    assert f.missing() == [(0, 10), (20, 30), (40, SIZE)]
    assert f.written_bytes() == 20
    assert [f.covered_end(pos) for pos in (0, 10, 15, 19, 20, 35, 40)] == [0, 20, 20, 20, 20, 40, 40]
    written(f, (40, SIZE))
    assert f.missing() == [(0, 10), (20, 30)]


def test_it_has_a_hash_pending_only_for_bytes_at_the_frontier(tmp_path):
    f = progress(tmp_path)
    f.new_hash()
    written(f, (50, 60))
    assert not f.hash_pending()  # ahead of the frontier: waits for the bytes before it
    written(f, (0, 10))
    assert f.hash_pending()
    f.hashed = 10
    assert not f.hash_pending()


def test_it_says_once_whether_it_changed(tmp_path):
    f = progress(tmp_path)
    assert not f.take_dirty()
    f.mark_dirty()
    assert f.take_dirty()
    assert not f.take_dirty()


def test_discarding_forgets_the_bytes_and_the_hash(tmp_path):
    f = progress(tmp_path)
    f.new_hash()
    written(f, (0, 40))
    f.hasher.update(b"x" * 40)
    f.hashed, f.complete = 40, True

    f.discard()

    assert (f.written_ranges(), f.hashed, f.complete, f.take_dirty()) == ([], 0, False, True)
    assert f.hasher.hexdigest() == hashlib.sha256(b"").hexdigest()


def test_refetching_starts_a_new_epoch_with_nothing_kept(tmp_path):
    f = progress(tmp_path)
    f.new_hash()
    written(f, (0, SIZE))
    f.hasher.update(b"x" * SIZE)
    f.hashed, f.bad, f.url = SIZE, True, "https://cdn.example/blob"
    f.note_peer("node-b", 0, SIZE)

    f.refetch()

    assert (f.epoch, f.written_ranges(), f.hashed, f.bad, f.url, f.peers) == (1, [], 0, False, None, set())
    assert f.writers == {}
    assert f.missing() == [(0, SIZE)]
    assert f.hasher.hexdigest() == hashlib.sha256(b"").hexdigest()


def test_it_creates_its_partial_file_on_first_use_and_closes_it_once(tmp_path):
    f = progress(tmp_path)
    fd = f.open()
    assert f.open() == fd  # the same descriptor while open
    assert f.path.is_file() and f.path.stat().st_size == 0
    f.close(sync=True)
    assert f.fd is None
    f.close(sync=True)  # closing again does nothing


def test_it_keeps_the_ranges_each_peer_wrote_a_write_continuing_one_extending_it(tmp_path):
    f = progress(tmp_path)
    with f.lock:
        f.note_peer("node-b", 0, 100)
        f.note_peer("node-b", 100, 250)  # the same request's next read
        f.note_peer("node-c", 250, 300)
        f.note_peer("node-b", 400, 500)  # another segment

    assert f.peers == {"node-b", "node-c"}
    assert f.writers == {"node-b": [[0, 250], [400, 500]], "node-c": [[250, 300]]}
