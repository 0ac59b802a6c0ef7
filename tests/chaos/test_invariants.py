"""The chaos run's checks catch what they are for: each is shown a cache, a store status, a mirror or a mount
that is wrong in one way, and must say so (a check that cannot fail would pass every chaos run)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from types import SimpleNamespace

from gpustack_models import kube
from tests.chaos import invariants as check
from tests.chaos.workload import Model, Mount, model_files


class Stores:
    """A kube client answering NodeModelStores from a dict (node -> status models)."""

    def __init__(self, models: dict[str, list[dict]]):
        self.models = models

    def get(self, path: str) -> dict:
        node = path.rsplit("/", 1)[1]
        if node not in self.models:
            raise kube.NotFound(message=node)
        return {"status": {"models": self.models[node]}}


def plugin_with(tmp_path: Path, node: str, trees: dict[str, dict[str, bytes]]):
    cache = tmp_path / node / "cache"
    for digest, files in trees.items():
        for name, data in files.items():
            path = cache / "models" / digest.split(":", 1)[1] / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return SimpleNamespace(node=node, env={"GPUSTACK_PLUGIN_CACHE_DIR": str(cache)})


def model(seed: str) -> Model:
    files = model_files(seed, 1)
    return Model("ns", seed, files, "sha256:" + hashlib.sha256(seed.encode()).hexdigest())


def test_a_flipped_byte_a_missing_file_and_an_unknown_tree_are_each_found(tmp_path):
    good, flipped, short = model("good"), model("flipped"), model("short")
    bad_bytes = dict(flipped.files, **{"model.safetensors": b"\x00" + flipped.files["model.safetensors"][1:]})
    missing = {k: v for k, v in short.files.items() if k != "tokenizer.json"}
    stranger = "sha256:" + "e" * 64
    plugin = plugin_with(tmp_path, "n1", {good.digest: good.files, flipped.digest: bad_bytes,
                                          short.digest: missing, stranger: {"x": b"x"}})  # fmt: skip
    known = {m.digest: m for m in (good, flipped, short)}
    found = check.trees([plugin], known)
    assert len(found) == 3, found
    assert any("flipped" in f and "model.safetensors" in f for f in found)
    assert any("short" in f and "tokenizer.json" in f for f in found)
    assert any("unknown digest" in f for f in found)
    assert check.trees([plugin_with(tmp_path, "n2", {good.digest: good.files})], known) == []


def test_status_and_disk_disagreeing_either_way_is_found(tmp_path):
    on_disk, only_in_status = model("disk"), model("status")
    plugin = plugin_with(tmp_path, "n1", {on_disk.digest: on_disk.files})
    agreeing = Stores({"n1": [{"digest": on_disk.digest, "state": "Ready"}]})
    assert check.status_matches_disk(agreeing, [plugin]) == []
    ready_elsewhere = Stores({"n1": [{"digest": on_disk.digest, "state": "Ready"},
                                     {"digest": only_in_status.digest, "state": "Ready"}]})  # fmt: skip
    assert check.status_matches_disk(ready_elsewhere, [plugin]) == [
        f"n1: {only_in_status.digest[:19]} Ready in status, not on disk"
    ]
    gone = check.status_matches_disk(Stores({"n1": []}), [plugin])
    assert gone == [f"n1: {on_disk.digest[:19]} on disk, not in status"]


def test_a_wanted_copy_not_ready_is_found():
    digest = "sha256:" + "a" * 64
    stores = Stores({"n1": [{"digest": digest, "state": "Downloading"}], "n2": []})
    assert check.wanted_ready(stores, {("n1", digest), ("n2", digest)}) == [
        f"n1: {digest[:19]} is Downloading",
        f"n2: {digest[:19]} is absent",
    ]
    assert check.wanted_ready(Stores({"n1": [{"digest": digest, "state": "Ready"}]}), {("n1", digest)}) == []


def test_a_mount_gone_or_its_model_collected_is_found(tmp_path):
    held = model("held")
    plugin = plugin_with(tmp_path, "n1", {})  # the model is not on the node's disk (collected)
    mount = Mount(held, plugin, "pod", "uid", tmp_path / "not-a-mount", done=True)
    assert check.mounts_hold(Stores({"n1": []}), [mount]) == ["n1: mount of ns/held by pod is gone"]
    source, target = tmp_path / "tree", tmp_path / "target"
    for name, data in held.files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    target.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(target)], check=True)
    try:
        mounted = Mount(held, plugin, "pod", "uid", target, done=True)
        assert check.mounts_hold(Stores({"n1": []}), [mounted]) == [
            "n1: mount of ns/held by pod: its model was collected from the node's disk",
            "n1: mount of ns/held by pod: its model is no longer in the store's status",
        ]
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_a_mirror_missing_an_object_holding_one_more_or_behind_is_found(monkeypatch):
    listed = {"modelartifacts": [("a", "one", 5), ("a", "two", 7)], "modelprefetches": [], "nodemodelstores": []}

    class Lists:
        def get(self, path):
            items = listed[path.rsplit("/", 1)[1]]
            metadata = [{"namespace": ns, "name": n, "resourceVersion": str(v)} for ns, n, v in items]
            return {"items": [{"metadata": m} for m in metadata]}

    mirrors = {"gpustack_models_artifact": {("a", "one"): 5, ("a", "two"): 7}}
    monkeypatch.setattr(check, "mirror_versions", lambda url, table: dict(mirrors.get(table, {})))
    assert check.mirror_matches_relist(Lists(), "db") == []
    mirrors["gpustack_models_artifact"] = {("a", "one"): 4, ("a", "gone"): 3}
    assert check.mirror_matches_relist(Lists(), "db") == [
        "modelartifacts: 1 missing in the mirror, e.g. [('a', 'two')]",
        "modelartifacts: 1 not in the cluster in the mirror, e.g. [('a', 'gone')]",
        "modelartifacts: 1 at another version in the mirror, e.g. [('a', 'one')]",
    ]
