"""The cache's layout on disk: where each digest's tree, partial work, checkpoint, record and manifest are,
a hostile digest never naming a path, documents replaced whole, publishing by one rename, and what a
start finds (only digests' directories, no half-written document, no manifest without its tree)."""

from __future__ import annotations

import hashlib
import os

import pytest

from gpustack_models.plugin.engine.cache import Cache, atomic_write_json, read_json
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

HEX = "ab" * 32
DIGEST = "sha256:" + HEX


@pytest.fixture
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "cache")


def partial_tree(cache: Cache, digest: str, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        (cache.partial_tree(digest) / path).parent.mkdir(parents=True, exist_ok=True)
        (cache.partial_tree(digest) / path).write_bytes(data)


def test_it_lays_each_digest_out_under_its_hex(cache):
    root = cache.root
    assert sorted(os.listdir(root)) == ["manifests", "models", "partial", "state", "trash"]
    assert cache.tree(DIGEST) == root / "models" / HEX
    assert cache.partial_tree(DIGEST) == root / "partial" / HEX / "tree"
    assert cache.checkpoint_path(DIGEST) == root / "partial" / HEX / "checkpoint.json"
    assert cache.record_path(DIGEST) == root / "state" / f"{HEX}.json"
    assert cache.manifest_path(DIGEST) == root / "manifests" / HEX


@pytest.mark.parametrize(
    "digest",
    [
        "sha256:../../etc",
        "sha256:" + HEX.upper(),
        "sha256:" + HEX + "/x",
        "sha256:" + HEX[:-1],
        "sha512:" + HEX,
        HEX,
        "",
    ],
    ids=["dotdot", "uppercase", "slash", "short", "other-algorithm", "bare-hex", "empty"],
)
def test_it_refuses_a_digest_that_is_not_one(cache, digest):
    for where in (cache.tree, cache.partial, cache.partial_tree, cache.checkpoint_path, cache.record_path):
        with pytest.raises(ValueError, match="not a manifest digest"):
            where(digest)
    with pytest.raises(ValueError):
        cache.remove(digest)


def test_it_lists_only_digests_directories_and_records(cache):
    for name in (HEX, "cd" * 32, "not-a-digest", ".hidden", HEX.upper()):
        (cache.root / "models" / name).mkdir()
    (cache.root / "partial" / ("ef" * 32)).mkdir()
    (cache.root / "state" / f"{HEX}.json").write_text("{}")
    (cache.root / "state" / "junk.json").write_text("{}")

    assert cache.published_digests() == ["sha256:" + HEX, "sha256:" + "cd" * 32]
    assert cache.partial_digests() == ["sha256:" + "ef" * 32]
    assert cache.recorded_digests() == [DIGEST]


def test_it_replaces_a_document_whole_and_reads_a_broken_one_as_none(cache, tmp_path):
    path = tmp_path / "doc.json"
    atomic_write_json(path, {"b": 1, "a": [1, 2]})
    atomic_write_json(path, {"c": "é"})
    assert read_json(path) == {"c": "é"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".doc")] == []  # no temporary left
    path.write_bytes(b'{"c": ')
    assert read_json(path) is None
    assert read_json(tmp_path / "missing.json") is None

    cache.save_record(DIGEST, {"state": "Ready"})
    assert cache.load_record(DIGEST) == {"state": "Ready"}
    cache.record_path(DIGEST).write_text("[1]")
    assert cache.load_record(DIGEST) is None  # not a record
    cache.delete_record(DIGEST)
    cache.delete_record(DIGEST)  # gone already: nothing to do
    assert cache.recorded_digests() == []


def test_it_publishes_by_one_rename_once(cache):
    files = {"config.json": b"{}", "weights/model.bin": b"w" * 100}
    manifest = [ManifestFile(p, len(d), "sha256", hashlib.sha256(d).hexdigest()) for p, d in files.items()]
    digest = manifest_digest(manifest)
    partial_tree(cache, digest, files)
    cache.checkpoint_path(digest).write_text("{}")

    tree = cache.publish(digest, manifest)

    assert tree == cache.tree(digest) and (tree / "weights" / "model.bin").read_bytes() == b"w" * 100
    assert not cache.partial(digest).exists()  # the checkpoint went with the partial work
    assert cache.manifest_path(digest).read_bytes().decode().endswith("weights/model.bin\n")
    partial_tree(cache, digest, files)
    with pytest.raises(FileExistsError):
        cache.publish(digest, manifest)
    assert cache.remove(digest) and not cache.published(digest) and not cache.manifest_path(digest).exists()
    assert not cache.remove(digest)


def test_a_start_clears_what_an_interrupted_process_left(tmp_path):
    cache = Cache(tmp_path / "cache")
    (cache.root / "trash" / "old-tree").mkdir()
    (cache.root / "trash" / "old-tree" / "model.bin").write_bytes(b"x")
    (cache.root / "state" / f".{HEX}.json.abc.tmp").write_text('{"state": ')
    (cache.root / "state" / f"{HEX}.json").write_text("{}")
    (cache.root / "manifests" / HEX).write_text("a manifest whose tree never came")

    restarted = Cache(cache.root)

    assert os.listdir(restarted.root / "trash") == []
    assert os.listdir(restarted.root / "state") == [f"{HEX}.json"]
    assert not restarted.manifest_path(DIGEST).exists()


def test_it_counts_partial_work_by_the_blocks_it_holds(cache):
    partial_tree(cache, DIGEST, {"model.bin": b"x" * 8192})
    sparse = cache.partial_tree(DIGEST) / "sparse.bin"
    with open(sparse, "wb") as f:
        f.truncate(1 << 30)  # a gigabyte long, nothing written
    assert cache.partial_bytes(DIGEST) < 1 << 20
    assert cache.partial_bytes(DIGEST) >= 8192
    assert Cache(cache.root, capacity_bytes=10 << 20).volume() == (10 << 20, cache.stored_bytes())
