"""The last step of a download: the tree verified once more, then published with one rename; a tree with a
bad byte, a file not verified, cut short or no longer the file it was linked to is never published."""

from __future__ import annotations

import hashlib
import os

import pytest

from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.failures import INTEGRITY_MISMATCH, DownloadFailed
from gpustack_models.plugin.engine.hashing import FileHash
from gpustack_models.plugin.engine.publish import verified_manifest, verify_and_publish
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.sharing import link_existing
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

FILES = {"config.json": b'{"model_type": "llama"}', "weights/model.safetensors": b"\x01\x02" * 3000, "empty": b""}


def manifest(files: dict[str, bytes]) -> list[ManifestFile]:
    return [ManifestFile(p, len(d), "sha256", hashlib.sha256(d).hexdigest(), True) for p, d in files.items()]


def downloaded(cache: Cache, digest: str, on_disk: dict[str, bytes], files=FILES) -> list[FileProgress]:
    """The partial tree of ``digest`` holding ``on_disk``, each file verified with what its bytes hash to
    (as the hash frontier leaves them), for the manifest of ``files``."""
    out = []
    for mf in manifest(files):
        f = FileProgress(mf, cache.partial_tree(digest) / mf.path)
        f.path.parent.mkdir(parents=True, exist_ok=True)
        f.path.write_bytes(on_disk[mf.path])
        hasher = FileHash("sha256", mf.size)
        hasher.update(on_disk[mf.path])
        f.verified, f.hexdigest = True, hasher.hexdigest()
        out.append(f)
    return out


@pytest.fixture
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "cache")


DIGEST = manifest_digest(manifest(FILES))


@pytest.mark.parametrize("durable", [True, False])
def test_it_publishes_a_verified_tree_with_its_manifest(cache, durable):
    files = downloaded(cache, DIGEST, FILES)

    tree = verify_and_publish(cache, DIGEST, files, durable=durable)

    assert tree == cache.tree(DIGEST) and cache.published(DIGEST)
    assert {p: (tree / p).read_bytes() for p in FILES} == FILES
    kept = [(f.path, f.size, f.checksum) for f in cache.load_manifest(DIGEST)]
    assert kept == sorted((f.path, f.size, f.checksum) for f in manifest(FILES))
    assert not cache.partial(DIGEST).exists()


def test_it_refuses_a_tree_with_a_bad_byte(cache):
    bad = {**FILES, "weights/model.safetensors": b"\x01\x03" + FILES["weights/model.safetensors"][2:]}
    files = downloaded(cache, DIGEST, bad)

    with pytest.raises(DownloadFailed) as caught:
        verify_and_publish(cache, DIGEST, files, durable=True)

    assert caught.value.reason == INTEGRITY_MISMATCH and f"not {DIGEST}" in caught.value.message
    assert not cache.published(DIGEST) and cache.published_digests() == []
    assert cache.partial_tree(DIGEST).is_dir()  # left for the download to discard or resume


def test_it_refuses_a_file_not_verified_or_not_of_its_size(cache):
    files = downloaded(cache, DIGEST, FILES)
    files[0].verified = False
    with pytest.raises(DownloadFailed, match="not complete after the download"):
        verified_manifest(files)

    files = downloaded(cache, DIGEST, FILES)
    weights = next(f for f in files if f.file.path.startswith("weights/"))
    os.truncate(weights.path, 10)
    with pytest.raises(DownloadFailed, match="10 bytes on disk") as caught:
        verify_and_publish(cache, DIGEST, files, durable=False)
    assert caught.value.reason == INTEGRITY_MISMATCH and weights.bad
    assert not cache.published(DIGEST)


def test_it_refuses_a_linked_file_replaced_since_it_was_linked(cache):
    shared = {"config.json": FILES["config.json"]}
    other = manifest_digest(manifest(shared))
    verify_and_publish(cache, other, downloaded(cache, other, shared, shared), durable=False)
    files = downloaded(cache, DIGEST, FILES)
    config = files[0]
    config.verified = False
    assert link_existing(config, cache.shared) == len(FILES["config.json"])  # linked from the Ready tree
    verified_manifest(files)  # still the linked inode: fine

    os.unlink(config.path)  # the link replaced by another file of the same bytes
    config.path.write_bytes(FILES["config.json"])
    with pytest.raises(DownloadFailed, match="not the file it was linked to"):
        verify_and_publish(cache, DIGEST, files, durable=False)
    assert config.bad and not cache.published(DIGEST)
