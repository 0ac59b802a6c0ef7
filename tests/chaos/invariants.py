"""What must hold after every round of faults, each check a list of what it found wrong (empty: it holds).

- ``trees``: every published tree on every node is, byte for byte, the files of the model its digest names;
- ``status_matches_disk``: every Ready entry of a NodeModelStore is on that node's disk, and every tree on
  disk is in the store's status;
- ``mirror_matches_relist``: the service's mirror (its database) holds exactly the objects and
  resourceVersions a fresh list of kube-apiserver returns;
- ``progress_answers``: ``progress`` answers 200 within 13 s for every artifact;
- ``mounts_hold``: every mount made is still a read-only mount of the right bytes, and the model it mounts is
  still on that node's disk and in its status (not collected);
- ``wanted_ready``: every (node, digest) a prefetch or a mount asks for is Ready (once faults stop).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import psycopg
import requests

from gpustack_models import kube
from gpustack_models.kinds import GROUP

STORAGE = f"/apis/{GROUP}/v1alpha1"
PROGRESS_SECONDS = 13.0
MIRRORED = {  # resource -> the mirror's table
    "modelartifacts": "gpustack_models_artifact",
    "modelprefetches": "gpustack_models_prefetch",
    "nodemodelstores": "gpustack_models_nodestore",
}


def file_sum(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def published(plugin) -> dict[str, Path]:
    """digest -> tree of every model published in ``plugin``'s cache."""
    root = Path(plugin.env["GPUSTACK_PLUGIN_CACHE_DIR"]) / "models"
    return {f"sha256:{p.name}": p for p in root.iterdir() if p.is_dir()} if root.is_dir() else {}


def tree_sums(tree: Path) -> dict[str, str]:
    return {str(p.relative_to(tree)): file_sum(p) for p in sorted(tree.rglob("*")) if p.is_file()}


def trees(plugins, by_digest) -> list[str]:
    wrong = []
    for plugin in plugins:
        for digest, tree in published(plugin).items():
            model = by_digest.get(digest)
            if model is None:
                wrong.append(f"{plugin.node}: a tree of unknown digest {digest}")
                continue
            try:
                got = tree_sums(tree)
            except FileNotFoundError:
                continue  # collected while read: gone whole, never half (the check after reads it again)
            if got != model.sums:
                bad = sorted(k for k in set(got) | set(model.sums) if got.get(k) != model.sums.get(k))
                wrong.append(f"{plugin.node}: {model.ns}/{model.name} {digest[:19]} differs in {bad}")
    return wrong


def store_models(client: kube.Kube, node: str) -> list[dict]:
    try:
        store = client.get(f"{STORAGE}/nodemodelstores/{node}")
    except kube.NotFound:
        return []
    return (store.get("status") or {}).get("models") or []


def status_matches_disk(client: kube.Kube, plugins) -> list[str]:
    wrong = []
    for plugin in plugins:
        on_disk = set(published(plugin))
        models = store_models(client, plugin.node)
        ready = {m["digest"] for m in models if m.get("state") == "Ready"}
        listed = {m["digest"] for m in models}
        wrong += [f"{plugin.node}: {d[:19]} Ready in status, not on disk" for d in sorted(ready - on_disk)]
        wrong += [f"{plugin.node}: {d[:19]} on disk, not in status" for d in sorted(on_disk - listed)]
    return wrong


def cluster_versions(client: kube.Kube, resource: str) -> dict[tuple[str, str], int]:
    listed = client.get(f"{STORAGE}/{resource}")["items"]
    return {(i["metadata"].get("namespace", ""), i["metadata"]["name"]): int(i["metadata"]["resourceVersion"])
            for i in listed}  # fmt: skip


def mirror_versions(database_url: str, table: str) -> dict[tuple[str, str], int]:
    namespace = "''" if table == "gpustack_models_nodestore" else "namespace"
    query = f"SELECT {namespace}, name, resource_version FROM {table} WHERE NOT deleted"
    with psycopg.connect(database_url, connect_timeout=5) as conn:
        return {(ns, name): int(version) for ns, name, version in conn.execute(query)}


def mirror_matches_relist(client: kube.Kube, database_url: str) -> list[str]:
    wrong = []
    for resource, table in MIRRORED.items():
        cluster, mirror = cluster_versions(client, resource), mirror_versions(database_url, table)
        missing = sorted(set(cluster) - set(mirror))
        extra = sorted(set(mirror) - set(cluster))
        stale = sorted(k for k in set(cluster) & set(mirror) if cluster[k] != mirror[k])
        for what, keys in (("missing", missing), ("not in the cluster", extra), ("at another version", stale)):
            if keys:
                wrong.append(f"{resource}: {len(keys)} {what} in the mirror, e.g. {keys[:3]}")
    return wrong


def progress_answers(admin: requests.Session, server: str, models) -> tuple[list[str], float]:
    """Problems, and the slowest answer's seconds."""
    wrong, slowest = [], 0.0
    for model in models:
        url = f"{server}/apis/{GROUP}/v1/namespaces/{model.ns}/modelartifacts/{model.name}/progress"
        started = time.monotonic()
        try:
            resp = admin.get(url, timeout=PROGRESS_SECONDS)
        except requests.RequestException as exc:
            wrong.append(f"progress of {model.ns}/{model.name}: {type(exc).__name__}")
            continue
        slowest = max(slowest, time.monotonic() - started)
        if resp.status_code != 200:
            wrong.append(f"progress of {model.ns}/{model.name}: {resp.status_code} {resp.text[:200]}")
    return wrong, slowest


def is_mount_point(path: Path) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)


def mounts_hold(client: kube.Kube, mounts) -> list[str]:
    wrong = []
    for mount in (m for m in mounts if m.done):
        where = f"{mount.plugin.node}: mount of {mount.model.ns}/{mount.model.name} by {mount.pod}"
        if not is_mount_point(mount.target):
            wrong.append(f"{where} is gone")
            continue
        if tree_sums(mount.target) != mount.model.sums:
            wrong.append(f"{where} reads other bytes")
        if mount.model.digest not in published(mount.plugin):
            wrong.append(f"{where}: its model was collected from the node's disk")
        if mount.model.digest not in {m["digest"] for m in store_models(client, mount.plugin.node)}:
            wrong.append(f"{where}: its model is no longer in the store's status")
    return wrong


def wanted_ready(client: kube.Kube, wanted: set[tuple[str, str]]) -> list[str]:
    entries: dict[tuple[str, str], dict] = {}
    for node in {node for node, _ in wanted}:
        entries |= {(node, model["digest"]): model for model in store_models(client, node)}
    wrong = []
    for node, digest in sorted(wanted):
        entry = entries.get((node, digest)) or {"state": "absent"}
        if entry["state"] != "Ready":
            wrong.append(f"{node}: {digest[:19]} is {entry['state']} {entry.get('reason', '')}".rstrip())
    return wrong
