"""The checkpoint of a download: saved and read back into a fresh file's progress (written ranges, hash
state, verified files), and what is not trusted: another digest's or a corrupt document, an entry of
other bytes, ranges the file on disk does not hold, a hash state past the written bytes."""

from __future__ import annotations

import hashlib
import json

import pytest

from gpustack_models.plugin.engine import checkpoint
from gpustack_models.plugin.engine.hashing import resumable_available
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.sources.manifest import ManifestFile

DIGEST = "sha256:" + "cd" * 32
DATA = bytes(range(251)) * 8  # 2008 bytes
MANIFEST = ManifestFile("model.bin", len(DATA), "sha256", hashlib.sha256(DATA).hexdigest(), True)


def progress(tmp_path, mf: ManifestFile = MANIFEST) -> FileProgress:
    return FileProgress(mf, tmp_path / "tree" / mf.path)


def on_disk(f: FileProgress, size: int) -> None:
    f.path.parent.mkdir(parents=True, exist_ok=True)
    f.path.write_bytes(DATA[:size])


def half_done(tmp_path) -> dict:
    """The entry of a file with ``[0, 1000)`` and ``[1500, 1800)`` written and its first 1000 bytes hashed."""
    f = progress(tmp_path)
    on_disk(f, 1800)
    f.new_hash()
    f.add_range(0, 1000)
    f.add_range(1500, 1800)
    f.hasher.update(DATA[:1000])
    f.hashed = 1000
    return checkpoint.progress_entry(f)


def test_it_resumes_a_file_from_its_saved_ranges_and_hash_state(tmp_path):
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, DIGEST, {"model.bin": half_done(tmp_path)})
    f = progress(tmp_path)

    checkpoint.restore(f, checkpoint.load(path, DIGEST)["model.bin"])

    assert f.written_ranges() == [[0, 1000], [1500, 1800]]
    assert f.missing() == [(1000, 1500), (1800, len(DATA))]
    assert f.hashed == (1000 if resumable_available() else 0)
    if f.hashed:
        f.hasher.update(DATA[1000:])
        assert f.hasher.hexdigest() == MANIFEST.hexdigest  # the saved state carries on the same hash


def test_it_resumes_a_verified_file_only_whole_on_disk(tmp_path):
    f = progress(tmp_path)
    on_disk(f, len(DATA))
    entry = checkpoint.verified_entry(f)
    checkpoint.restore(f, entry)
    assert (f.verified, f.hexdigest) == (True, MANIFEST.hexdigest)

    truncated = progress(tmp_path)
    on_disk(truncated, 100)
    checkpoint.restore(truncated, entry)
    assert (truncated.verified, truncated.written_ranges(), truncated.hashed) == (False, [], 0)
    assert truncated.hasher is not None


@pytest.mark.parametrize(
    "document",
    [b'{"version": 1, "digest": "sha', b"\x00\xff garbage", b"[]", b'{"version": 2, "digest": "%s", "files": {}}'],
    ids=["torn", "garbage", "not-an-object", "other-version"],
)
def test_it_reads_a_corrupt_or_foreign_checkpoint_as_none(tmp_path, document):
    path = tmp_path / "checkpoint.json"
    path.write_bytes(document.replace(b"%s", DIGEST.encode()) if b"%s" in document else document)
    assert checkpoint.load(path, DIGEST) == {}


def test_it_reads_another_digests_checkpoint_as_none(tmp_path):
    path = tmp_path / "checkpoint.json"
    checkpoint.save(path, DIGEST, {"model.bin": half_done(tmp_path)})
    assert checkpoint.load(path, "sha256:" + "ef" * 32) == {}
    assert checkpoint.load(tmp_path / "missing.json", DIGEST) == {}
    assert json.loads(path.read_text())["version"] == checkpoint.CHECKPOINT_VERSION


def test_it_ignores_an_entry_of_other_bytes(tmp_path):
    entry = half_done(tmp_path)
    other = ManifestFile("model.bin", len(DATA), "sha256", "0" * 64, True)
    for mf, saved in ((other, entry), (MANIFEST, {**entry, "size": len(DATA) + 1}), (MANIFEST, "junk")):
        f = progress(tmp_path, mf)
        checkpoint.restore(f, saved)
        assert (f.written_ranges(), f.hashed, f.verified) == ([], 0, False)
        assert f.hasher is not None


def test_it_trusts_written_ranges_only_as_far_as_the_file_on_disk_reaches(tmp_path):
    entry = half_done(tmp_path)
    f = progress(tmp_path)
    on_disk(f, 600)  # the file lost its tail (written, never made durable)
    checkpoint.restore(f, entry)
    assert f.written_ranges() == [[0, 600]]
    assert f.hashed == 0  # the hash state was past the bytes left


def test_it_drops_malformed_ranges_and_a_hash_state_it_cannot_use(tmp_path):
    entry = half_done(tmp_path)
    f = progress(tmp_path)
    checkpoint.restore(f, {**entry, "written": [[0, "x"]], "hash": "garbage"})
    assert (f.written_ranges(), f.hashed) == ([], 0)

    f = progress(tmp_path)
    checkpoint.restore(f, {**entry, "hash": "garbage"})
    assert f.written_ranges() == [[0, 1000], [1500, 1800]]
    assert f.hashed == 0 and f.hasher.hexdigest() == hashlib.sha256().hexdigest()  # hashed again from 0
