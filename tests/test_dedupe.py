"""Files already on the node are hard-linked, not downloaded again: two artifacts of one repository with
overlapping patterns share their common files' inodes, fetched from the hub once and counted once in the
store's bytes; removing one tree leaves the other whole. First the engine with the fake hub, then real
plugin processes with the worker and the control plane."""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid

import pytest
import requests
from prometheus_client import generate_latest

from gpustack_models.kinds import GROUP
from gpustack_models.plugin.engine import READY, Engine, FetchTicket, Metrics
from gpustack_models.plugin.engine.sharing import SharedFiles, parse_manifest
from gpustack_models.sources.manifest import ManifestFile, manifest_digest, manifest_text
from tests.plugin.conftest import manifest, random_bytes, settings, tree_files
from tests.support import TEST_STATE, wait_for
from tests.support.stores import store
from tests.support.worker import COLLECTION_GRACE
from tests.test_lifecycle import create_prefetch, spec_item
from tests.test_plugins import Scenario

MiB = 1024 * 1024
STORAGE = f"/apis/{GROUP}/v1alpha1"
SHARED = ("config.json", "tokenizer.json", "shared.safetensors")  # in both artifacts


def repository_files(seed: str) -> dict[str, bytes]:
    """Two quantizations and what they share: a small git file, an LFS tokenizer, shared weights."""
    n = int(hashlib.sha256(seed.encode()).hexdigest()[:6], 16)
    return {
        "config.json": json.dumps({"model": seed}).encode(),  # under the hub's LFS threshold: git blob sha1
        "tokenizer.json": (seed * 200).encode(),  # LFS: sha256
        "shared.safetensors": random_bytes(2 * MiB, seed=n),
        "q4.safetensors": random_bytes(1 * MiB, seed=n + 1),
        "q8.safetensors": random_bytes(1 * MiB, seed=n + 2),
    }


def linked_total(text: str) -> float:
    """``gpustack_models_plugin_linked_bytes_total`` in a metrics exposition (-1 when absent)."""
    match = re.search(r"^gpustack_models_plugin_linked_bytes_total (\S+)$", text, re.M)
    return float(match.group(1)) if match else -1.0


def ticket_of(hub, repo, commit, own: str) -> FetchTicket:
    """The ticket of the artifact of ``repo`` selecting the shared files and ``own``."""
    files = [f for f in manifest(hub, repo, commit) if f.path in SHARED + (own,)]
    return FetchTicket(manifest_digest(files), "huggingFace", hub.url, repo, commit, files)


def served(hub, since, files: dict[str, bytes]) -> dict[str, int]:
    """Body bytes the hub served per repository path since request ``since`` (resolve or CDN)."""
    by_sha = {hashlib.sha256(data).hexdigest(): path for path, data in files.items()}
    out: dict[str, int] = {}
    for r in hub.requests[since:]:
        if r.method != "GET" or r.status not in (200, 206) or not r.bytes_sent:
            continue
        if r.listener == "cdn":
            path = by_sha.get(r.path.rsplit("/", 1)[-1], r.path)
        elif "/resolve/" in r.path:
            path = r.path.split("/resolve/", 1)[1].split("/", 1)[1]
        else:
            continue
        out[path] = out.get(path, 0) + r.bytes_sent
    return out


def fetched(hub, since, files: dict[str, bytes]) -> list[str]:
    """The repository paths whose bytes the hub served since request ``since``."""
    return sorted(served(hub, since, files))


def inode(path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


@pytest.fixture
def engines(tmp_path):
    made: list[Engine] = []

    def make(**kwargs) -> Engine:
        engine = Engine(tmp_path / "cache", settings=settings(), capacity_bytes=100 * MiB, **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close(timeout=10)


def ready(engine, ticket) -> None:
    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=60)
    assert entry.state == READY, entry


# ---------------------------------------------------------------- the engine


def test_the_shared_files_are_linked_fetched_once_and_counted_once(fakehub, engines):
    files = repository_files("dedupe-engine")
    commit = fakehub.add_hf_repo("org/quants", files)
    q4, q8 = (
        ticket_of(fakehub, "org/quants", commit, "q4.safetensors"),
        ticket_of(fakehub, "org/quants", commit, "q8.safetensors"),
    )
    metrics = Metrics()
    engine = engines(metrics=metrics)
    ready(engine, q4)
    mark = len(fakehub.requests)
    ready(engine, q8)

    assert fetched(fakehub, mark, files) == ["q8.safetensors"]
    shared_bytes = sum(len(files[p]) for p in SHARED)
    assert engine.stats(q8.digest)["linked_bytes"] == shared_bytes
    a, b = engine.path(q4.digest), engine.path(q8.digest)
    for path in SHARED:
        assert inode(a / path) == inode(b / path) and os.stat(b / path).st_nlink == 2
    assert tree_files(b) == {p: files[p] for p in SHARED + ("q8.safetensors",)}
    assert engine.entry(q8.digest).size_bytes == q8.size  # each tree reports its whole size
    assert engine.capacity()["storedBytes"] == sum(len(d) for d in files.values()) == q4.size + q8.size - shared_bytes
    assert linked_total(generate_latest(metrics.registry).decode()) == shared_bytes

    # Removing one tree removes its links only: the other keeps every byte, now counted alone.
    assert engine.remove(q4.digest)
    assert not a.exists()
    assert tree_files(b) == {p: files[p] for p in SHARED + ("q8.safetensors",)}
    assert engine.capacity()["storedBytes"] == q8.size
    assert os.stat(b / "shared.safetensors").st_nlink == 1


def test_a_restarted_engine_counts_shared_inodes_once_and_links_from_its_trees(fakehub, engines):
    files = repository_files("dedupe-restart")
    commit = fakehub.add_hf_repo("org/restart", files)
    q4, q8 = (
        ticket_of(fakehub, "org/restart", commit, "q4.safetensors"),
        ticket_of(fakehub, "org/restart", commit, "q8.safetensors"),
    )
    first = engines()
    ready(first, q4)
    first.close()

    restarted = engines()
    mark = len(fakehub.requests)
    ready(restarted, q8)  # the manifest of the tree published before the restart is on disk
    assert fetched(fakehub, mark, files) == ["q8.safetensors"]
    restarted.close()
    again = engines()
    assert again.capacity()["storedBytes"] == sum(len(d) for d in files.values())


def test_a_manifest_changed_on_disk_is_not_trusted(fakehub, engines, tmp_path):
    """Someone rewrites the Ready tree's manifest so that its weights claim to be the other artifact's: the
    document no longer hashes to its digest, nothing is linked from it, the bytes come from the hub."""
    files = repository_files("dedupe-forged")
    files["q8.safetensors"] = files["q4.safetensors"][:-1] + bytes([files["q4.safetensors"][-1] ^ 0xFF])
    commit = fakehub.add_hf_repo("org/forged", files)
    q4, q8 = (
        ticket_of(fakehub, "org/forged", commit, "q4.safetensors"),
        ticket_of(fakehub, "org/forged", commit, "q8.safetensors"),
    )
    first = engines()
    ready(first, q4)
    first.close()
    path = tmp_path / "cache" / "manifests" / q4.hex
    q8_weights = next(f for f in q8.files if f.path == "q8.safetensors")
    forged = [f for f in q4.files if f.path != "q4.safetensors"] + [
        ManifestFile("q4.safetensors", q8_weights.size, "sha256", q8_weights.hexdigest, True)
    ]
    path.write_bytes(manifest_text(forged).encode())
    assert parse_manifest(path.read_bytes(), q4.digest) is None

    restarted = engines()
    mark = len(fakehub.requests)
    ready(restarted, q8)
    assert fetched(fakehub, mark, files) == sorted(SHARED + ("q8.safetensors",))
    assert (restarted.path(q8.digest) / "q8.safetensors").read_bytes() == files["q8.safetensors"]
    assert (restarted.path(q4.digest) / "q4.safetensors").read_bytes() == files["q4.safetensors"]


def test_a_download_never_writes_into_an_inode_another_tree_holds(fakehub, engines, tmp_path):
    """A partial file left as a hard link of a Ready tree's file (no checkpoint says it is done) is
    unlinked and fetched anew: writing into it would change the Ready tree's bytes."""
    files = repository_files("dedupe-isolate")
    commit = fakehub.add_hf_repo("org/isolate", files)
    q4, q8 = (
        ticket_of(fakehub, "org/isolate", commit, "q4.safetensors"),
        ticket_of(fakehub, "org/isolate", commit, "q8.safetensors"),
    )
    engine = engines()
    ready(engine, q4)
    engine.close()
    partial = tmp_path / "cache" / "partial" / q8.hex / "tree"
    partial.mkdir(parents=True)
    os.link(engine.path(q4.digest) / "q4.safetensors", partial / "q8.safetensors")  # same size, other bytes

    restarted = engines()
    ready(restarted, q8)
    assert (restarted.path(q4.digest) / "q4.safetensors").read_bytes() == files["q4.safetensors"]
    assert (restarted.path(q8.digest) / "q8.safetensors").read_bytes() == files["q8.safetensors"]
    assert os.stat(restarted.path(q4.digest) / "q4.safetensors").st_nlink == 1


def test_a_symbolic_link_in_a_tree_is_never_linked(fakehub, engines, tmp_path):
    """A Ready tree's file replaced by a symbolic link (to anything) is not a source: the file is fetched."""
    files = repository_files("dedupe-symlink")
    commit = fakehub.add_hf_repo("org/symlink", files)
    q4, q8 = (
        ticket_of(fakehub, "org/symlink", commit, "q4.safetensors"),
        ticket_of(fakehub, "org/symlink", commit, "q8.safetensors"),
    )
    engine = engines()
    ready(engine, q4)
    engine.close()
    weights = engine.path(q4.digest) / "shared.safetensors"
    (tmp_path / "elsewhere").write_bytes(files["shared.safetensors"])
    weights.unlink()
    weights.symlink_to(tmp_path / "elsewhere")

    restarted = engines()
    mark = len(fakehub.requests)
    ready(restarted, q8)
    assert "shared.safetensors" in fetched(fakehub, mark, files)
    published = restarted.path(q8.digest) / "shared.safetensors"
    assert not published.is_symlink() and published.read_bytes() == files["shared.safetensors"]


def test_the_bytes_freed_by_removing_trees_count_each_inode_once(tmp_path):
    trees = {}
    for name in ("a", "b", "c"):
        trees[name] = tmp_path / name
        trees[name].mkdir()
    (trees["a"] / "shared").write_bytes(b"x" * 100)
    os.link(trees["a"] / "shared", trees["b"] / "shared")
    (trees["a"] / "own").write_bytes(b"y" * 10)
    (trees["b"] / "own").write_bytes(b"z" * 20)
    (trees["c"] / "own").write_bytes(b"w" * 5)
    shared = SharedFiles()
    for name, tree in trees.items():
        shared.add(f"sha256:{name * 64}", tree, None)
    a, b, c = (f"sha256:{n * 64}" for n in "abc")
    assert shared.stored_bytes() == 135
    assert (shared.exclusive_bytes(a), shared.exclusive_bytes(b), shared.exclusive_bytes(c)) == (10, 20, 5)
    assert shared.freed_bytes([a, b]) == 130 and shared.freed_bytes([a, c]) == 15
    shared.remove(a)
    assert shared.stored_bytes() == 125 and shared.exclusive_bytes(b) == 120


# ---------------------------------------------------------------- real plugins


def create_artifact(kube, ns, name, repo, allow):
    kube.create(
        f"{STORAGE}/namespaces/{ns}/modelartifacts",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": name},
            "spec": {"source": {"huggingFace": {"repository": repo}}, "allowPatterns": allow},
        },
    )

    def digest():
        obj = kube.get(f"{STORAGE}/namespaces/{ns}/modelartifacts/{name}")
        return ((obj.get("status") or {}).get("resolved") or {}).get("manifestDigest")

    return wait_for(digest, timeout=60, message=f"{name} to resolve")


def stored_bytes(kube, node) -> int | None:
    return (((store(kube, node) or {}).get("status") or {}).get("capacity") or {}).get("storedBytes")


def linked_metric(plugin) -> float:
    s = requests.Session()
    s.trust_env = False
    return linked_total(s.get(f"{plugin.url}/metrics", verify=False, timeout=10).text)


def test_two_artifacts_of_one_repository_on_one_node_fetch_and_store_the_shared_files_once(
    worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin
):
    life = Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    repo = f"org/quants-{uuid.uuid4().hex[:6]}"
    files = repository_files(repo)
    hub.add_hf_repo(repo, files)
    q4 = create_artifact(worker_kube, namespace, "q4", repo, ["*.json", "shared.*", "q4.*"])
    q8 = create_artifact(worker_kube, namespace, "q8", repo, ["*.json", "shared.*", "q8.*"])
    (plugin,) = life.plugins(1, GPUSTACK_PLUGIN_REMOVAL_DELAY_SECONDS=1)
    mark = len(hub.requests)
    create_prefetch(worker_kube, namespace, "q4", "q4", nodeNames=[plugin.node])
    life.digest = q4
    life.wait_state(plugin.node, "Ready", timeout=120)
    create_prefetch(worker_kube, namespace, "q8", "q8", nodeNames=[plugin.node])
    life.digest = q8
    life.wait_state(plugin.node, "Ready", timeout=120)

    # The hub served every file once: the shared ones for the first artifact only.
    assert served(hub, mark, files) == {path: len(data) for path, data in files.items()}
    a, b = plugin.cache / "models" / q4.split(":")[1], plugin.cache / "models" / q8.split(":")[1]
    for path in SHARED:
        assert inode(a / path) == inode(b / path), path
        assert (b / path).read_bytes() == files[path]
    unique = sum(len(d) for d in files.values())
    wait_for(lambda: stored_bytes(worker_kube, plugin.node) == unique, timeout=30, message="stored bytes counted once")
    shared_bytes = sum(len(files[p]) for p in SHARED)
    assert linked_metric(plugin) == shared_bytes
    log = (TEST_STATE / f"plugin-{plugin.node}.log").read_text()
    assert re.search(rf"download {q8[:19]} ready: .* {shared_bytes} bytes linked", log), "no linked bytes logged"

    # The first artifact is collected: its links go, the second tree keeps every byte.
    worker_kube.delete(f"{STORAGE}/namespaces/{namespace}/modelprefetches/q4")
    wait_for(lambda: not a.exists(), timeout=COLLECTION_GRACE + 60, message="the first tree collected")
    assert spec_item(worker_kube, plugin.node, q4) is None
    for path in SHARED + ("q8.safetensors",):
        assert (b / path).read_bytes() == files[path], path
    own = unique - len(files["q4.safetensors"])
    wait_for(lambda: stored_bytes(worker_kube, plugin.node) == own, timeout=30, message="the second tree alone")
    assert life.entry(plugin.node)["state"] == "Ready"
