"""Facade overhead: the aggregated v1 against the v1alpha1 CRD directly, measured side by side."""

import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from gpustack_models.kinds import GROUP

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
AS_ADMIN = {"X-Remote-User": "kubernetes-admin", "X-Remote-Group": "system:masters"}


def front_proxy_cert(cluster):
    return str(cluster.pki_path("front-proxy-client.crt")), str(cluster.pki_path("front-proxy-client.key"))


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
        # The service as kube-apiserver's proxy reaches it (front-proxy certificate, the admin's identity).
        direct = worker_api.session(cert=front_proxy_cert(cluster), headers=AS_ADMIN)
        discovery = f"{cluster.server}/apis/{GROUP}/v1"
        get_v1, get_crd, get_direct, hop, list_v1, list_crd, json_v1, json_crd = ([] for _ in range(8))
        with profiled(worker_api.proc.pid, "facade-get"):
            for i in range(gets):
                name = f"m-{i % count:05d}"
                get_v1.append(timed(admin_http, f"{public}/{name}")[0])
                get_crd.append(timed(admin_http, f"{storage}/{name}")[0])
                get_direct.append(timed(direct, f"{worker_api.url}{public.removeprefix(cluster.server)}/{name}")[0])
                hop.append(timed(admin_http, discovery)[0])
        with profiled(worker_api.proc.pid, "facade-list"):
            for _ in range(lists):
                elapsed, resp = timed(admin_http, public, {"Accept": TABLE})
                assert len(resp.json()["rows"]) == count
                list_v1.append(elapsed)
                elapsed, resp = timed(admin_http, storage, {"Accept": TABLE})
                assert len(resp.json()["rows"]) == count
                list_crd.append(elapsed)
                json_v1.append(timed(admin_http, public)[0])
                json_crd.append(timed(admin_http, storage)[0])
        assert len(get_v1) == len(get_crd) == len(get_direct) == len(hop) == gets
        assert len(list_v1) == len(list_crd) == len(json_v1) == len(json_crd) == lists
        assert min(get_v1 + get_crd + get_direct + hop + list_v1 + list_crd + json_v1 + json_crd) > 0
        crd = p50(get_crd)
        record(
            f"facade: get p50 v1 {p50(get_v1):.1f} ms vs v1alpha1 {crd:.1f} ms "
            f"(ratio {p50(get_v1) / crd:.2f}, target <= 1.3; +{p50(get_v1) - crd:.1f} ms, target <= 5); "
            f"{count}-item Table list p50 v1 {p50(list_v1):.1f} ms vs v1alpha1 {p50(list_crd):.1f} ms "
            f"(ratio {p50(list_v1) / p50(list_crd):.2f}, target <= 1.2)"
        )
        record(
            f"facade floor: the aggregator's hop to the service answering from memory (GET /apis/{GROUP}/v1) "
            f"p50 {p50(hop):.1f} ms = {p50(hop) / crd:.2f}x the CRD get; the v1 get straight to the service "
            f"(no aggregator) p50 {p50(get_direct):.1f} ms = {p50(get_direct) / crd:.2f}x; the {count}-item list as "
            f"JSON, passed through as bytes, p50 {p50(json_v1):.1f} ms vs {p50(json_crd):.1f} ms "
            f"(ratio {p50(json_v1) / p50(json_crd):.2f})"
        )
    finally:
        core.delete_namespace(namespace)
