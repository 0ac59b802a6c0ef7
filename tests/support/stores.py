"""Fixtures and helpers for NodeModelStore scenarios: fresh plugin nodes, a resolved artifact, prefetches
and entries written as a plugin would."""

from __future__ import annotations

import itertools
import uuid

import pytest

from gpustack_models import kube
from gpustack_models.kinds import GROUP

from .kubernetes import kube_update
from .waiting import wait_for

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
