"""The mirror at cluster size: a full relist of 10,000 ModelArtifacts and 1,000 Nodes by a fresh
``runinformers`` process (time until the mirror holds every row, the process's peak and resident memory),
then the memory of each of the API's worker processes after serving a list of every artifact and a
``progress`` (target: at most 300 MB each). Smoke size: 200 artifacts, 20 nodes.

The objects are created while the informers are stopped, so starting them is a full relist into a mirror
that has never seen them. Artifacts take their files from a claim (resolved by the claim existing, no hub);
Nodes are plain objects the mirror follows (no kubelet)."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpustack_models.kinds import GROUP
from gpustack_models.models import Artifact, Node
from tests.support import wait_for

MB = 1024 * 1024


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident) of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def _create_all(client, path: str, bodies, threads: int = 16) -> None:
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda body: client.create(path, body), bodies))


def _artifact(i: int) -> dict:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"name": f"s-{i:05d}"},
        "spec": {"source": {"persistentVolumeClaim": {"claimName": "models"}}},
    }


def _node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"bench": "scale"}}}


@pytest.fixture
def admin_kube(cluster):
    from gpustack_models import kube

    return kube.Kube(kube.load_configuration(str(cluster.kubeconfig)), pool_size=32)


@pytest.fixture
def bench_nodes(admin_kube):
    prefix = f"scale-{uuid.uuid4().hex[:6]}"
    names: list[str] = []
    yield prefix, names
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: admin_kube.request("DELETE", f"/api/v1/nodes/{n}"), names))


@pytest.mark.disruptive  # stops and starts the informers
def test_bench_full_relist_and_memory(
    worker_stack, worker_api, worker_kube, admin_kube, admin_http, namespace, bench_nodes, mirror_db, bench_scale,
    record,
):  # fmt: skip
    full = bench_scale == "full"
    artifacts, nodes = (10_000, 1_000) if full else (200, 20)
    prefix, names = bench_nodes
    admin_kube.create(
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models"},
         "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}}},
    )  # fmt: skip
    worker_stack.stop("informers")
    try:
        started = time.monotonic()
        names += [f"{prefix}-{i:04d}" for i in range(nodes)]
        _create_all(admin_kube, "/api/v1/nodes", [_node(n) for n in names])
        base = f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts"
        _create_all(worker_kube, base, [_artifact(i) for i in range(artifacts)])
        created = time.monotonic() - started
    finally:
        worker_stack.start("informers")
    relist_started = time.monotonic()
    informers = worker_stack.procs["informers"].pid

    def mirrored() -> bool:
        return (
            Artifact.objects.live().filter(namespace=namespace).count() == artifacts
            and Node.objects.live().filter(name__startswith=prefix).count() == nodes
        )

    wait_for(mirrored, timeout=900 if full else 120, interval=0.5, message="the relist to reach the mirror")
    relist = time.monotonic() - relist_started
    informer_memory = memory(informers)
    assert relist > 0 and created > 0 and 0 < informer_memory["VmRSS"] <= informer_memory["VmHWM"], informer_memory
    record(
        f"relist: {artifacts} artifacts and {nodes} nodes mirrored {relist:.1f} s after runinformers started "
        f"(created in {created:.1f} s); informers RSS {informer_memory['VmRSS'] / MB:.0f} MB, "
        f"peak {informer_memory['VmHWM'] / MB:.0f} MB (target <= 300)"
    )
    _api_memory(worker_api, admin_http, namespace, artifacts, record)


def _api_memory(worker_api, admin_http, namespace: str, artifacts: int, record) -> None:
    url = f"{admin_http.base}/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts"
    workers = children(worker_api.proc.pid)
    assert workers, "the API runs no worker process"
    before = {pid: memory(pid)["VmRSS"] for pid in workers}
    started = time.monotonic()
    for _ in range(2 * len(workers)):  # each worker likely serves one
        answer = admin_http.get(url, timeout=120)
        assert answer.status_code == 200, answer.text[:500]
        assert len(answer.json()["items"]) == artifacts
    listed = (time.monotonic() - started) / (2 * len(workers))
    assert listed > 0
    progress = admin_http.get(f"{url}/s-00000/progress", timeout=60)
    assert progress.status_code == 200, progress.text[:500]
    for pid in workers:
        now = memory(pid)
        assert before[pid] > 0 and 0 < now["VmRSS"] <= now["VmHWM"], (before[pid], now)
        record(
            f"api worker {pid}: RSS {now['VmRSS'] / MB:.0f} MB after listing {artifacts} artifacts "
            f"(was {before[pid] / MB:.0f} MB; peak {now['VmHWM'] / MB:.0f} MB; list {listed:.2f} s) (target <= 300)"
        )
