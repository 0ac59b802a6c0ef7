"""Facade overhead: the aggregated v1 against the v1alpha1 CRD directly, measured side by side."""

import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from gpustack_models.kinds import GROUP

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def p50(samples):
    return statistics.median(samples) * 1000


def timed(session, url, headers=None):
    started = time.perf_counter()
    resp = session.get(url, headers=headers or {})
    elapsed = time.perf_counter() - started
    assert resp.status_code == 200, resp.text[:300]
    return elapsed, resp


def test_bench_facade_overhead(worker_api, cluster, admin_http, storage_http, core, bench_scale, record, profiled):
    from kubernetes import client as k8s

    full = bench_scale == "full"
    count, gets, lists = (1000, 400, 30) if full else (40, 10, 2)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    storage = f"{cluster.server}/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts"
    public = f"{cluster.server}/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts"

    def create(i):
        body = {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "ModelArtifact",
            "metadata": {"name": f"m-{i:05d}"},
            "spec": {"source": {"huggingFace": {"repository": f"org/model-{i}"}}, "allowPatterns": ["*.json"]},
        }
        assert storage_http.post(storage, json=body).status_code == 201

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(count)))
        # Warm both paths (connections, caches) before measuring.
        for _ in range(3):
            timed(admin_http, f"{public}/m-00000")
            timed(admin_http, f"{storage}/m-00000")
        get_v1, get_crd, list_v1, list_crd = [], [], [], []
        with profiled(worker_api.proc.pid, "facade-get"):
            for i in range(gets):
                name = f"m-{i % count:05d}"
                get_v1.append(timed(admin_http, f"{public}/{name}")[0])
                get_crd.append(timed(admin_http, f"{storage}/{name}")[0])
        for _ in range(lists):
            elapsed, resp = timed(admin_http, public, {"Accept": TABLE})
            assert len(resp.json()["rows"]) == count
            list_v1.append(elapsed)
            elapsed, resp = timed(admin_http, storage, {"Accept": TABLE})
            assert len(resp.json()["rows"]) == count
            list_crd.append(elapsed)
        assert len(get_v1) == len(get_crd) == gets and len(list_v1) == len(list_crd) == lists
        assert min(get_v1 + get_crd + list_v1 + list_crd) > 0
        added = p50(get_v1) - p50(get_crd)
        ratio = p50(list_v1) / p50(list_crd)
        record(
            f"facade: get p50 v1 {p50(get_v1):.1f} ms vs v1alpha1 {p50(get_crd):.1f} ms "
            f"(+{added:.1f} ms, target <= 5); "
            f"{count}-item Table list p50 v1 {p50(list_v1):.1f} ms vs v1alpha1 {p50(list_crd):.1f} ms "
            f"(ratio {ratio:.2f}, target <= 1.5)"
        )
    finally:
        core.delete_namespace(namespace)
