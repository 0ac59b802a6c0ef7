"""Fixtures and helpers for NodeModelStore scenarios: fresh plugin nodes, a resolved artifact, prefetches
and entries written as a plugin would, a reconcile of a store on demand, and a ``collectTime`` checked
against the moment its reference ended."""

from __future__ import annotations

import itertools
import math
import time
import uuid
from datetime import UTC, datetime

import pytest

from gpustack_models import kube
from gpustack_models.kinds import GROUP
from tests.support.cluster import fresh_namespace
from tests.support.kubernetes import kube_update
from tests.support.waiting import wait_for
from tests.support.worker import COLLECTION_GRACE

STORAGE = f"/apis/{GROUP}/v1alpha1"
_ips = itertools.count(20)


@pytest.fixture
def nodes(worker_stack, launcher):
    """Three fresh nodes, each running the plugin (as a kubelet would report it)."""
    names = [f"n-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    for name in names:
        launcher.register_node(name, f"127.0.0.{next(_ips)}")
    yield names
    for name in names:
        launcher.unregister_node(name)


def store(worker_kube, name):
    """The store of ``name``, or None while there is none (any other error fails the test)."""
    try:
        return worker_kube.get(f"{STORAGE}/nodemodelstores/{name}")
    except kube.NotFound:
        return None


def digests(obj):
    return sorted(m["digest"] for m in ((obj or {}).get("spec") or {}).get("models") or [])


@pytest.fixture
def resolved(worker_stack, worker_kube, namespace, hub):
    """A resolved artifact in the test namespace; returns (name, digest)."""
    repo = f"org/w-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {"config.json": repo.encode(), "model.safetensors": b"w" * 4096})
    worker_kube.create(
        f"{STORAGE}/namespaces/{namespace}/modelartifacts",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": "art"},
            "spec": {"source": {"huggingFace": {"repository": repo}}},
        },
    )

    def digest():
        obj = worker_kube.get(f"{STORAGE}/namespaces/{namespace}/modelartifacts/art")
        return (obj.get("status") or {}).get("resolved", {}).get("manifestDigest")

    return "art", wait_for(digest, timeout=60, message="the artifact to resolve")


def prefetch(worker_kube, namespace, name, artifact, node_names):
    return worker_kube.create(
        f"{STORAGE}/namespaces/{namespace}/modelprefetches",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelPrefetch",
            "metadata": {"name": name},
            "spec": {"artifactRef": {"name": artifact}, "nodeNames": node_names},
        },
    )


def place(worker_kube, namespace, artifact, digest, node_names, name=None):
    """Prefetch ``artifact`` onto ``node_names`` and wait until each node's spec.models lists ``digest``: a
    node's entries of a digest count only where the digest was placed."""
    prefetch(worker_kube, namespace, name or f"place-{uuid.uuid4().hex[:6]}", artifact, node_names)
    for node in node_names:
        wait_for(
            lambda node=node: digest in digests(store(worker_kube, node)), timeout=30, message=f"{node} to want it"
        )


def put_entries(worker_kube, node, entries):
    return kube_update(
        worker_kube, f"{STORAGE}/nodemodelstores/{node}/status", lambda obj: dict(obj, status={"models": entries})
    )


def entry(digest, state, downloaded=0, size=1000, reason=None):
    out = {"digest": digest, "state": state, "sizeBytes": size, "downloadedBytes": downloaded}
    if reason:
        out["reason"] = reason
        out["retryTime"] = "2030-01-01T00:00:00Z"
    return out


CONCURRENCY_ANNOTATION = f"{GROUP}/download-concurrency"


def reconciled(admin, worker_kube, node, *, observed=False):
    """The store of ``node`` as the worker decides it after this call: a new value of the Node's
    download-concurrency annotation (9 or 10, never a limit below the default) makes the worker reconcile
    the store, and the first spec carrying it is returned (with ``observed``: once the node's plugin has
    seen that spec). ``unannotated`` removes the annotation."""
    current = (((store(worker_kube, node) or {}).get("spec") or {}).get("download") or {}).get("concurrency")
    value = 10 if current == 9 else 9
    patch = {"metadata": {"annotations": {CONCURRENCY_ANNOTATION: str(value)}}}
    admin.json("PATCH", f"/api/v1/nodes/{node}", body=patch, content_type="application/merge-patch+json")

    def decided():
        obj = store(worker_kube, node) or {}
        if ((obj.get("spec") or {}).get("download") or {}).get("concurrency") != value:
            return None
        if observed and (obj.get("status") or {}).get("observedGeneration") != obj["metadata"]["generation"]:
            return None
        return obj

    seen = " seen by its plugin" if observed else ""
    return wait_for(decided, timeout=30, message=f"a reconcile of {node}'s store{seen}")


def unannotated(admin, node):
    patch = {"metadata": {"annotations": {CONCURRENCY_ANNOTATION: None}}}
    admin.json("PATCH", f"/api/v1/nodes/{node}", body=patch, content_type="application/merge-patch+json")


def epoch(timestamp: str) -> float:
    """An RFC 3339 timestamp of the API (whole seconds, UTC) as seconds since the epoch."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def assert_grace(collect_time: str, ended_after: float, seen_by: float):
    """``collect_time`` is the collection grace after a reference that ended after ``ended_after`` and before
    ``seen_by`` (wall clock, ``time.time()``); the service rounds it up to whole seconds."""
    at = epoch(collect_time)
    ended = [datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S.%f") for t in (ended_after, seen_by)]
    assert ended_after + COLLECTION_GRACE <= at <= math.ceil(seen_by + COLLECTION_GRACE), (
        f"collectTime {collect_time} is not {COLLECTION_GRACE} s after the reference ended (between {ended[0]} "
        f"and {ended[1]})"
    )


def first_seen(checks: dict, timeout: float, interval: float = 0.2) -> dict[str, float]:
    """Poll every check of ``checks`` (name -> predicate) until each has held once; when each was first seen
    to hold (``time.monotonic()``). For lower bounds: a moment is seen at or after it happens."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(checks):
        for name, check in checks.items():
            if name not in seen and check():
                seen[name] = time.monotonic()
        if time.monotonic() > deadline:
            missing = sorted(set(checks) - set(seen))
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {', '.join(missing)}")
        if len(seen) < len(checks):
            time.sleep(interval)
    return seen


def tenants_of(core, count):
    """``count`` fresh namespaces: (name, the generator that deletes it when advanced)."""
    made = []
    for _ in range(count):
        gen = fresh_namespace(core)
        made.append((next(gen), gen))
    return made


def cap_prefetches(kube_client, namespaces) -> dict[tuple[str, str], dict]:
    """Every prefetch of ``namespaces`` by (namespace, name)."""
    found = {}
    for ns in namespaces:
        for item in kube_client.get(f"{STORAGE}/namespaces/{ns}/modelprefetches")["items"]:
            found[ns, item["metadata"]["name"]] = item
    return found


def node_full(prefetches: dict[tuple[str, str], dict]) -> set[tuple[str, str]]:
    """The prefetches whose Degraded reason is NodeFull."""
    found = set()
    for key, item in prefetches.items():
        conds = {c["type"]: c for c in (item.get("status") or {}).get("conditions") or []}
        if conds.get("Degraded", {}).get("reason") == "NodeFull":
            found.add(key)
    return found


def cap_digests(kube_client, keys) -> set[str]:
    """The digests of the artifacts that the prefetches ``keys`` ((namespace, "p<n>")) name ("a<n>")."""
    out = set()
    for ns, name in keys:
        art = kube_client.get(f"{STORAGE}/namespaces/{ns}/modelartifacts/a{name[1:]}")
        out.add(art["status"]["resolved"]["manifestDigest"])
    return out


def fill_past_the_cap(kube_client, hub, node, namespaces, count) -> None:
    """``count`` artifacts of distinct digests, ten per namespace (a namespace's burst of resolutions),
    each prefetched onto ``node`` by ``p<n>``."""
    repo = f"org/cap-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {f"f{i:03d}.json": f"{repo} {i}".encode() for i in range(count)})
    for n in range(count):
        ns = namespaces[n // 10]
        kube_client.create(
            f"{STORAGE}/namespaces/{ns}/modelartifacts",
            {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": f"a{n}"},
             "spec": {"source": {"huggingFace": {"repository": repo}}, "allowPatterns": [f"f{n:03d}.json"]}},
        )  # fmt: skip
        prefetch(kube_client, ns, f"p{n}", f"a{n}", [node])
