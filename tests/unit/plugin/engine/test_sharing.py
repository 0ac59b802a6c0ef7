"""Files shared between the trees of one cache: which files may be linked (a Ready tree's file of the same
checksum and size, a regular file still of that size; never an empty one, never from a tree without its
manifest), a shared inode never written into, and bytes counted once per inode."""

from __future__ import annotations

import hashlib
import os

import pytest

from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.sharing import (
    isolate,
    link_existing,
    manifest_bytes,
    parse_manifest,
    still_linked,
)
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

WEIGHTS = b"\x07" * 5000
CONFIG = b'{"model_type": "llama"}'


def mf(path: str, data: bytes) -> ManifestFile:
    return ManifestFile(path, len(data), "sha256", hashlib.sha256(data).hexdigest(), True)


def publish(cache: Cache, files: dict[str, bytes], *, keep_manifest: bool = True) -> str:
    manifest = [mf(p, d) for p, d in files.items()]
    digest = manifest_digest(manifest)
    for path, data in files.items():
        (cache.partial_tree(digest) / path).parent.mkdir(parents=True, exist_ok=True)
        (cache.partial_tree(digest) / path).write_bytes(data)
    cache.publish(digest, manifest if keep_manifest else None)
    return digest


def partial(cache: Cache, path: str, data: bytes) -> FileProgress:
    """A file of a new download (``sha256:00..``) still to fetch."""
    f = FileProgress(mf(path, data), cache.partial_tree("sha256:" + "0" * 64) / path)
    f.new_hash()
    return f


@pytest.fixture
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "cache")


def test_it_trusts_a_kept_manifest_only_if_it_hashes_to_the_digest():
    files = [mf("model.safetensors", WEIGHTS), mf("config.json", CONFIG)]
    digest = manifest_digest(files)
    data = manifest_bytes(files)
    parsed = parse_manifest(data, digest)
    assert [(f.path, f.size, f.checksum) for f in parsed] == sorted((f.path, f.size, f.checksum) for f in files)
    assert parse_manifest(data.replace(b"5000", b"5001"), digest) is None
    garbled = b"gpustack-manifest v1\nnot a line\n"
    assert parse_manifest(garbled, "sha256:" + hashlib.sha256(garbled).hexdigest()) is None


def test_it_links_a_ready_trees_file_of_the_same_checksum_and_size(cache):
    ready = publish(cache, {"model.safetensors": WEIGHTS, "config.json": CONFIG})
    f = partial(cache, "renamed/weights.bin", WEIGHTS)

    assert link_existing(f, cache.shared) == len(WEIGHTS)

    source = os.stat(cache.tree(ready) / "model.safetensors")
    assert (f.verified, f.hexdigest, f.linked) == (True, f.file.hexdigest, (source.st_dev, source.st_ino))
    assert os.stat(f.path).st_ino == source.st_ino and still_linked(f)
    assert link_existing(f, cache.shared) == 0  # verified already: nothing more to do


def test_it_links_nothing_that_is_not_the_same_file(cache):
    publish(cache, {"model.safetensors": WEIGHTS, "empty.txt": b""})
    publish(cache, {"config.json": CONFIG}, keep_manifest=False)  # a tree without its manifest

    assert link_existing(partial(cache, "other.bin", WEIGHTS[:-1] + b"\x08"), cache.shared) == 0  # other bytes
    assert link_existing(partial(cache, "empty.txt", b""), cache.shared) == 0
    assert link_existing(partial(cache, "config.json", CONFIG), cache.shared) == 0


def test_it_links_nothing_when_the_ready_file_changed_size_or_kind(cache):
    ready = publish(cache, {"model.safetensors": WEIGHTS})
    source = cache.tree(ready) / "model.safetensors"
    os.truncate(source, 10)
    f = partial(cache, "model.safetensors", WEIGHTS)
    assert link_existing(f, cache.shared) == 0
    assert (f.verified, f.path.exists()) == (False, False)

    os.unlink(source)
    (cache.root / "elsewhere.bin").write_bytes(WEIGHTS)
    os.symlink(cache.root / "elsewhere.bin", source)  # a symbolic link is never followed
    assert link_existing(f, cache.shared) == 0 and not f.verified


def test_it_never_writes_into_a_file_with_another_name(cache):
    ready = publish(cache, {"model.safetensors": WEIGHTS})
    f = partial(cache, "model.safetensors", WEIGHTS)
    f.path.parent.mkdir(parents=True)
    os.link(cache.tree(ready) / "model.safetensors", f.path)  # left by an interrupted attempt
    f.add_range(0, 100)

    isolate(f)

    assert not f.path.exists() and f.written_ranges() == []
    assert (cache.tree(ready) / "model.safetensors").read_bytes() == WEIGHTS
    f.path.write_bytes(b"own")  # a file of its own stays
    isolate(f)
    assert f.path.read_bytes() == b"own"


def test_a_link_replaced_after_linking_is_no_longer_trusted(cache):
    publish(cache, {"model.safetensors": WEIGHTS})
    f = partial(cache, "model.safetensors", WEIGHTS)
    assert link_existing(f, cache.shared)
    os.unlink(f.path)
    f.path.write_bytes(WEIGHTS)  # the same bytes, another inode
    assert not still_linked(f)
    os.unlink(f.path)
    assert not still_linked(f)
    assert still_linked(partial(cache, "never-linked.bin", b"x"))


def test_it_counts_a_shared_inode_once_and_frees_it_with_its_last_tree(cache):
    a = publish(cache, {"model.safetensors": WEIGHTS, "config.json": CONFIG})
    f = partial(cache, "model.safetensors", WEIGHTS)
    link_existing(f, cache.shared)
    b_files = {"model.safetensors": WEIGHTS, "tokenizer.json": b"t" * 300}
    b = manifest_digest([mf(p, d) for p, d in b_files.items()])
    os.renames(f.path, cache.partial_tree(b) / "model.safetensors")  # the linked file, in b's tree
    (cache.partial_tree(b) / "tokenizer.json").write_bytes(b_files["tokenizer.json"])
    cache.publish(b, [mf(p, d) for p, d in b_files.items()])
    shared = cache.shared

    assert shared.stored_bytes() == len(WEIGHTS) + len(CONFIG) + 300
    assert (shared.exclusive_bytes(a), shared.exclusive_bytes(b)) == (len(CONFIG), 300)
    assert shared.freed_bytes([a, b]) == shared.stored_bytes()

    cache.remove(a)
    assert shared.stored_bytes() == len(WEIGHTS) + 300  # b's link keeps the bytes
    assert shared.exclusive_bytes(b) == len(WEIGHTS) + 300
    assert shared.find(mf("x", CONFIG)) is None and shared.find(mf("x", WEIGHTS)) is not None
