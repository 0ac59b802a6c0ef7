"""What the placement webhook adds to a Pod create: Pods mounting a model created through the real
kube-apiserver with the webhook registered (it is called, authenticates kube-apiserver, reads the mirror and
answers a patch) and with it unregistered, side by side in one run. Target: at most 10 ms added at p50."""

import statistics
import time
import uuid

from tests.support.kubernetes import wait_default_service_account
from tests.support.stores import entry, place, put_entries, store
from tests.support.waiting import wait_for
from tests.test_placement import model_pod

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


def test_pod_create_with_and_without_the_placement_webhook(
    launcher, worker_api, worker_kube, nodes, namespace, resolved, bench_scale, record, profiled
):
    from gpustack_models import install

    admin = launcher.admin
    name, digest = resolved
    wait_for(lambda: store(worker_kube, nodes[0]), timeout=30, message="the store")
    place(worker_kube, namespace, name, digest, [nodes[0]])
    put_entries(worker_kube, nodes[0], [entry(digest, "Ready", 4096, 4096)])
    wait_default_service_account(admin, namespace)
    count = 200 if bench_scale == "full" else 5
    # Warm up both paths (connections, caches), and wait until the mirror knows the holder.
    wait_for(lambda: create_pods(admin, namespace, name, 1)[1] == 1, timeout=30, message="a preferred placement")
    with profiled(worker_api.proc.pid, "placement-webhook"):
        with_hook, preferred = create_pods(admin, namespace, name, count)
    assert preferred == count, f"only {preferred} of {count} Pods got a placement preference"
    webhook = admin.get(f"{WEBHOOKS}/{install.webhooks.NAME}")
    admin.delete(f"{WEBHOOKS}/{install.webhooks.NAME}")
    try:
        wait_for(lambda: create_pods(admin, namespace, name, 1)[1] == 0, timeout=30, message="the webhook to be gone")
        without, preferred = create_pods(admin, namespace, name, count)
        assert preferred == 0
    finally:
        webhook["metadata"] = {"name": webhook["metadata"]["name"], "labels": webhook["metadata"].get("labels", {})}
        admin.create(WEBHOOKS, webhook)
    assert len(with_hook) == len(without) == count and min(with_hook + without) > 0
    p50_with, p50_without = statistics.median(with_hook), statistics.median(without)
    record(
        f"pod create with a model volume ({count} Pods): p50 {p50_with:.1f} ms with the placement webhook, "
        f"{p50_without:.1f} ms without (+{p50_with - p50_without:.1f} ms; target <= 10 ms)"
    )
