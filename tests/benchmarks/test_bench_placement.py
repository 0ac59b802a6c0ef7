"""What the placement webhook adds to a Pod create: Pods mounting a model created through the real
kube-apiserver with the webhook registered (it is called, authenticates kube-apiserver, reads the mirror and
answers a patch) and with it unregistered, side by side in one run. Target: at most 10 ms added at p50."""

import statistics
import time
import uuid

from tests.support.kubernetes import wait_default_service_account
from tests.support.stores import entry, place, put_entries, store
from tests.support.waiting import wait_for
from tests.test_placement import client_cert, model_pod, review

WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def create_pods(admin, namespace: str, artifact: str, count: int) -> tuple[list[float], int]:
    """Create ``count`` Pods; their create latencies (ms) and how many got a placement preference."""
    times, preferred = [], 0
    for _ in range(count):
        pod = model_pod(f"p-{uuid.uuid4().hex[:8]}", artifact, automountServiceAccountToken=False)
        t0 = time.perf_counter()
        created = admin.create(f"/api/v1/namespaces/{namespace}/pods", pod)
        times.append((time.perf_counter() - t0) * 1000)
        preferred += bool((created["spec"].get("affinity") or {}).get("nodeAffinity"))
    return times, preferred


def answer_directly(session, url: str, namespace: str, artifact: str, count: int) -> list[float]:
    """Latencies (ms) of the placement webhook answering ``count`` reviews sent straight to it, as
    kube-apiserver sends them (its client certificate, one kept-alive connection)."""
    times = []
    for _ in range(count):
        body = review(namespace, model_pod(f"p-{uuid.uuid4().hex[:8]}", artifact))
        t0 = time.perf_counter()
        resp = session.post(url, json=body, timeout=10)
        times.append((time.perf_counter() - t0) * 1000)
        assert resp.status_code == 200 and resp.json()["response"].get("patch"), resp.text[:300]
    return times


def test_pod_create_with_and_without_the_placement_webhook(
    launcher, worker_api, worker_kube, cluster, nodes, namespace, resolved, bench_scale, record, profiled, tmp_path
):
    """Pods created in alternating blocks with and without the webhook configured (so a drift of the machine's
    speed falls on both sides alike), and the webhook's own share: the same reviews answered directly."""
    from django.conf import settings

    from gpustack_models import install

    admin = launcher.admin
    name, digest = resolved
    wait_for(lambda: store(worker_kube, nodes[0]), timeout=30, message="the store")
    place(worker_kube, namespace, name, digest, [nodes[0]])
    put_entries(worker_kube, nodes[0], [entry(digest, "Ready", 4096, 4096)])
    wait_default_service_account(admin, namespace)
    rounds, per = (4, 50) if bench_scale == "full" else (1, 5)
    # Warm up both paths (connections, caches), and wait until the mirror knows the holder.
    wait_for(lambda: create_pods(admin, namespace, name, 1)[1] == 1, timeout=30, message="a preferred placement")
    webhook = admin.get(f"{WEBHOOKS}/{install.webhooks.NAME}")
    webhook["metadata"] = {"name": webhook["metadata"]["name"], "labels": webhook["metadata"].get("labels", {})}
    with_hook, without = [], []
    for _ in range(rounds):
        with profiled(worker_api.proc.pid, "placement-webhook"):
            times, preferred = create_pods(admin, namespace, name, per)
        assert preferred == per, f"only {preferred} of {per} Pods got a placement preference"
        with_hook += times
        admin.delete(f"{WEBHOOKS}/{install.webhooks.NAME}")
        try:
            wait_for(lambda: create_pods(admin, namespace, name, 1)[1] == 0, timeout=30, message="the webhook gone")
            times, preferred = create_pods(admin, namespace, name, per)
            assert preferred == 0
            without += times
        finally:
            admin.create(WEBHOOKS, dict(webhook, metadata=dict(webhook["metadata"])))
        wait_for(lambda: create_pods(admin, namespace, name, 1)[1] == 1, timeout=30, message="the webhook back")
    session = worker_api.session(cert=client_cert(cluster, tmp_path, settings.PLACEMENT_CALLER))
    with profiled(worker_api.proc.pid, "placement-webhook-direct"):
        direct = answer_directly(session, f"{worker_api.url}{install.webhooks.PATH}", namespace, name, rounds * per)
    count = rounds * per
    assert len(with_hook) == len(without) == len(direct) == count and min(with_hook + without + direct) > 0
    p50_with, p50_without = statistics.median(with_hook), statistics.median(without)
    record(
        f"pod create with a model volume ({count} Pods, {rounds} alternating blocks): p50 {p50_with:.1f} ms with the"
        f" placement webhook, {p50_without:.1f} ms without (+{p50_with - p50_without:.1f} ms, target <= 10 ms;"
        f" ratio {p50_with / p50_without:.2f}, target <= 1.5); the webhook answering directly p50"
        f" {statistics.median(direct):.1f} ms"
    )
