"""Informer event to mirror row: the lag from a CRD change to its row, at a steady rate of changes."""

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from kubernetes import client as k8s

from gpustack_models.kinds import GROUP
from gpustack_models.models import Artifact
from tests.support import wait_for


def test_bench_mirror_lag(worker_stack, worker_kube, core, namespace, bench_scale, record):
    full = bench_scale == "full"
    objects, rate, seconds = (200, 200, 10) if full else (20, 50, 1)
    base = f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts"
    # Claim sources resolve once, by the claim existing: no hub traffic while measuring.
    core.create_namespaced_persistent_volume_claim(
        namespace,
        k8s.V1PersistentVolumeClaim(
            metadata=k8s.V1ObjectMeta(name="models"),
            spec=k8s.V1PersistentVolumeClaimSpec(
                access_modes=["ReadOnlyMany"], resources=k8s.V1VolumeResourceRequirements(requests={"storage": "1Gi"})
            ),
        ),
    )
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: worker_kube.create(
                    base,
                    {
                        "apiVersion": f"{GROUP}/v1alpha1",
                        "kind": "ModelArtifact",
                        "metadata": {"name": f"b-{i:04d}"},
                        "spec": {"source": {"persistentVolumeClaim": {"claimName": "models"}}},
                    },
                ),
                range(objects),
            )
        )
    wait_for(
        lambda: Artifact.objects.live().filter(namespace=namespace, resolved_status="True").count() == objects,
        timeout=120,
        interval=0.5,
        message="the objects to settle",
    )

    writes: list[tuple[str, int, float]] = []
    seen: dict[tuple[str, int], float] = {}
    done = threading.Event()

    def poll():
        from django.db import connection
        from django.utils import timezone

        since = timezone.now()
        while not done.is_set():
            now, wall = time.monotonic(), timezone.now()
            # Only rows written since the last look (with a margin for clock steps between processes).
            rows = Artifact.objects.filter(namespace=namespace, updated_at__gte=since).values_list(
                "name", "resource_version"
            )
            for name, rv in rows:
                seen.setdefault((name, rv), now)
            since = wall - timedelta(milliseconds=200)
            time.sleep(0.02)
        connection.close()

    latencies = []

    def change(i):
        name = f"b-{i % objects:04d}"
        t0 = time.monotonic()
        obj = worker_kube.json(
            "PATCH",
            f"{base}/{name}",
            body={"metadata": {"labels": {"n": str(i)}}},
            content_type="application/merge-patch+json",
        )
        writes.append((name, int(obj["metadata"]["resourceVersion"]), time.monotonic()))
        latencies.append(time.monotonic() - t0)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    total = rate * seconds
    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        for i in range(total):
            target = started + i / rate
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(change, i)
    achieved = total / (time.monotonic() - started)

    def all_seen():
        rows = dict(Artifact.objects.filter(namespace=namespace).values_list("name", "resource_version"))
        return all(rows.get(name, 0) >= rv for name, rv, _ in writes)

    wait_for(all_seen, timeout=60, interval=0.2, message="the mirror to catch up")
    done.set()
    poller.join()
    # What the poller had no time to see is seen now: at the latest, never earlier than it was.
    now = time.monotonic()
    for name, rv in Artifact.objects.filter(namespace=namespace).values_list("name", "resource_version"):
        seen.setdefault((name, rv), now)
    lags = []
    for name, rv, written in writes:
        # The row may have moved past this version before a poll caught it: take the first poll showing
        # this version or a later one.
        times = [t for (n, r), t in seen.items() if n == name and r >= rv]
        assert times, f"version {rv} of {name} never reached the mirror"
        lags.append(max(0.0, min(times) - written))
    lags.sort()
    p50 = statistics.median(lags) * 1000
    p99 = lags[int(len(lags) * 0.99) - 1 if len(lags) > 1 else 0] * 1000
    record(
        f"mirror: {len(writes)} changes at {achieved:.0f}/s: lag p50 {p50:.0f} ms, p99 {p99:.0f} ms "
        f"(target p99 <= 1000; write latency p50 {statistics.median(latencies) * 1000:.0f} ms)"
    )
