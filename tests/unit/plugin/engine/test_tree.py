"""The files of one download's partial tree: opened fresh, resumed from the checkpoint or linked from a Ready
tree; closed and verified once hashed; checkpointed only when something changed; set aside after a failure,
the data of a file that failed verification deleted and the others' kept."""

from __future__ import annotations

import hashlib

import pytest

from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.frontier import HashFrontier
from gpustack_models.plugin.engine.tree import PartialTree
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

FILES = {"config.json": b'{"model_type": "llama"}', "empty.txt": b"", "model.bin": bytes(range(256)) * 20}
MANIFEST = [ManifestFile(p, len(d), "sha256", hashlib.sha256(d).hexdigest(), True) for p, d in FILES.items()]
DIGEST = manifest_digest(MANIFEST)
FRONTIER = HashFrontier(on_hashed=lambda n: None, on_reread=lambda n: None, on_complete=lambda: None)


def stats() -> dict[str, int]:
    return {"resumed_bytes": 0, "resumed_hash_bytes": 0, "linked_bytes": 0}


def opened(cache: Cache, counted: dict[str, int] | None = None) -> PartialTree:
    tree = PartialTree(cache, DIGEST, FRONTIER, durable=True, on_failure=[].append)
    tree.open(MANIFEST, counted if counted is not None else stats())
    return tree


def write(tree: PartialTree, path: str, start: int, end: int, data: bytes | None = None) -> None:
    """Bytes ``[start, end)`` of ``path`` written and recorded, as a download's worker does."""
    f = next(f for f in tree.files if f.file.path == path)
    chunk = (data if data is not None else FILES[path])[start:end]
    with open(f.path, "r+b" if f.path.exists() else "wb") as out:
        out.seek(start)
        out.write(chunk)
    FRONTIER.record(f, start, end, memoryview(chunk))


@pytest.fixture
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "cache")


def test_a_fresh_tree_has_every_file_to_fetch_and_its_empty_files_made(cache):
    counted = stats()
    tree = opened(cache, counted)

    assert [f.file.path for f in tree.files] == list(FILES)
    assert (cache.partial_tree(DIGEST) / "empty.txt").read_bytes() == b""
    assert tree.on_disk_bytes() == 0 and counted == stats()
    assert tree.written() == [("config.json", 23, []), ("empty.txt", 0, []), ("model.bin", 5120, [])]


def test_it_resumes_from_its_checkpoint_what_was_written_and_hashed(cache):
    tree = opened(cache)
    write(tree, "model.bin", 0, 1000)
    write(tree, "model.bin", 3000, 4000)  # ahead of the hash frontier
    tree.checkpoint(sync=True, advance=False)
    tree.set_aside(mismatch=False)

    counted = stats()
    again = opened(cache, counted)

    assert again.written()[2] == ("model.bin", 5120, [[0, 1000], [3000, 4000]])
    assert again.on_disk_bytes() == 2000
    assert counted["resumed_bytes"] == 2000
    assert counted["resumed_hash_bytes"] in (0, 1000)  # 1000 where the hash state can be restored


def test_it_links_a_file_a_ready_tree_holds(cache):
    ready = [MANIFEST[2]]
    other = manifest_digest(ready)
    (cache.partial_tree(other)).mkdir(parents=True)
    (cache.partial_tree(other) / "model.bin").write_bytes(FILES["model.bin"])
    cache.publish(other, ready)
    counted = stats()

    tree = opened(cache, counted)

    assert counted["linked_bytes"] == len(FILES["model.bin"])
    assert tree.written()[2] == ("model.bin", 5120, [[0, 5120]])
    assert tree.on_disk_bytes() == 5120


def test_it_closes_a_hashed_file_as_verified_and_checkpoints_only_changes(cache):
    tree = opened(cache)
    write(tree, "config.json", 0, len(FILES["config.json"]))
    config = tree.files[0]
    assert config.complete and not config.verified

    tree.close_completed(None)
    assert config.verified and config.fd is None
    tree.checkpoint(sync=True, advance=True)
    saved = cache.checkpoint_path(DIGEST)
    assert saved.exists()
    saved.unlink()
    tree.checkpoint(sync=True, advance=True)
    assert not saved.exists()  # nothing changed since: nothing written

    assert not opened(cache).files[0].verified  # the checkpoint is gone: nothing on disk is trusted


def test_after_a_mismatch_it_deletes_the_bad_files_data_and_keeps_the_others(cache):
    tree = opened(cache)
    write(tree, "config.json", 0, len(FILES["config.json"]))
    with pytest.raises(DownloadFailed):
        write(tree, "model.bin", 0, 5120, b"\xff" + FILES["model.bin"][1:])
    tree.checkpoint(sync=True, advance=False)

    tree.set_aside(mismatch=True)

    config, _, model = tree.files
    assert not model.path.exists() and model.written_ranges() == [] and model.hashed == 0
    assert config.path.read_bytes() == FILES["config.json"] and config.verified
    tree.checkpoint(sync=False, advance=False)
    assert [f.verified for f in opened(cache).files] == [True, False, False]
