"""The console at cluster size: each page's render time and query count with the mirror holding 1,000 nodes,
10,000 artifacts (100 tenants of 100) and 50,000 entries (each artifact's content on five nodes), against the
same pages over a tenth of that, side by side. Pages render in-process (Django's test client, a staff user):
the time is the console's own work, database included, without a network hop."""

import statistics
import time
import uuid

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

FAR_FUTURE_RV = 10**15
STATES = ("Ready", "Ready", "Ready", "Downloading", "Failed")


def fill(prefix: str, nodes: int, tenants: int, per_tenant: int) -> None:
    from gpustack_models.models import Artifact, Holding, Manifest, NodeStore, PluginPod, StoreEntry

    rv = {"resource_version": FAR_FUTURE_RV}
    names = [f"{prefix}-n{i:05d}" for i in range(nodes)]
    spec = {"spec": {"watermarks": {"highPercent": 80, "lowPercent": 70}}}
    NodeStore.objects.bulk_create(
        [NodeStore(name=n, body=spec, total_bytes=10**13, stored_bytes=4 * 10**12, used_percent=40, **rv)
         for n in names],
        batch_size=2000,
    )  # fmt: skip
    PluginPod.objects.bulk_create(
        [PluginPod(namespace=prefix, name=n, node=n, ready=True, body={}, **rv) for n in names], batch_size=2000
    )
    digests = [f"sha256:{uuid.uuid4().hex}{uuid.uuid4().hex}" for _ in range(tenants * per_tenant)]
    files = [{"path": f"model-{i}.safetensors", "size": 10**9, "algorithm": "sha256", "hexdigest": "0" * 64,
              "lfs": True} for i in range(5)]  # fmt: skip
    Manifest.objects.bulk_create(
        [Manifest(digest=d, files=files, file_count=5, size_bytes=5 * 10**9) for d in digests], batch_size=2000
    )
    Artifact.objects.bulk_create(
        [Artifact(namespace=f"{prefix}-t{i // per_tenant:03d}", name=f"a{i}", digest=d, size_bytes=5 * 10**9,
                  source="huggingFace", repository=f"org/m{i}", resolved_status="True", resolved_reason="Resolved",
                  body={}, **rv) for i, d in enumerate(digests)],
        batch_size=2000,
    )  # fmt: skip
    stores = dict(NodeStore.objects.filter(name__startswith=prefix).values_list("name", "id"))
    entries = []
    for i, digest in enumerate(digests):
        for j, state in enumerate(STATES):
            node = names[(i * 5 + j) % nodes]
            entries.append(
                StoreEntry(store_id=stores[node], node=node, digest=digest, state=state, size_bytes=5 * 10**9,
                           downloaded_bytes=10**9 if state == "Downloading" else 5 * 10**9 * (state == "Ready"),
                           reason="SourceUnavailable" if state == "Failed" else "")
            )  # fmt: skip
    StoreEntry.objects.bulk_create(entries, batch_size=5000)
    Holding.objects.bulk_create([Holding(node=e.node, digest=e.digest) for e in entries], batch_size=5000)


def clear(prefix: str) -> None:
    from gpustack_models.models import Artifact, Holding, Manifest, NodeStore, PluginPod, StoreEntry

    digests = list(Artifact.objects.filter(namespace__startswith=prefix).values_list("digest", flat=True))
    StoreEntry.objects.filter(node__startswith=prefix).delete()
    Holding.objects.filter(node__startswith=prefix).delete()
    Artifact.objects.filter(namespace__startswith=prefix).delete()
    Manifest.objects.filter(digest__in=digests).delete()
    PluginPod.objects.filter(namespace=prefix).delete()
    NodeStore.objects.filter(name__startswith=prefix).delete()


def pages(prefix: str) -> dict[str, str]:
    from gpustack_models.models import Artifact, NodeStore

    store = NodeStore.objects.filter(name__startswith=prefix).order_by("name").first()
    artifact = Artifact.objects.filter(namespace__startswith=prefix).order_by("namespace", "name").first()
    return {
        "dashboard": "/admin/",
        "tenants": "/admin/tenants/",
        "tenant": f"/admin/tenants/{artifact.namespace}/",
        "artifacts": "/admin/gpustack_models/artifact/",
        "nodes": "/admin/nodes/",
        "node": f"/admin/nodes/{store.name}/",
        "artifact": f"/admin/artifacts/{artifact.namespace}/{artifact.name}/",
    }


def measure(client: Client, url: str, samples: int) -> tuple[float, int]:
    client.get(url)  # per-process caches (content types, templates)
    timings, queries = [], 0
    for _ in range(samples):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url)
            timings.append(time.perf_counter() - started)
        assert response.status_code == 200, (url, response.status_code)
        queries = len(captured)
    return statistics.median(timings) * 1000, queries


def test_bench_console(worker_stack, mirror_db, django_user_model, bench_scale, record):
    full = bench_scale == "full"
    sizes = [(100, 10, 100), (1_000, 100, 100)] if full else [(10, 2, 10), (40, 4, 10)]
    samples = 10 if full else 1
    user = django_user_model.objects.create_superuser(f"bench-{uuid.uuid4().hex[:6]}", password=uuid.uuid4().hex)
    client = Client()
    client.force_login(user)
    results = []
    try:
        for nodes, tenants, per_tenant in sizes:
            prefix = f"cb{uuid.uuid4().hex[:6]}"
            fill(prefix, nodes, tenants, per_tenant)
            try:
                results.append({name: measure(client, url, samples) for name, url in pages(prefix).items()})
            finally:
                clear(prefix)
    finally:
        user.delete()
    small, large = results
    for result in results:  # every page rendered, taking time and queries
        assert len(result) == 7 and all(ms > 0 and queries > 0 for ms, queries in result.values()), result
    assert {k: q for k, (_, q) in small.items()} == {k: q for k, (_, q) in large.items()}, (small, large)
    big = sizes[1]
    parts = [f"{name} {large[name][0]:.0f} ms ({small[name][0]:.0f}), {large[name][1]} queries" for name in large]
    record(
        f"console pages at {big[0]:,} nodes, {big[1] * big[2]:,} artifacts, {big[1] * big[2] * 5:,} entries "
        f"(a tenth of that in brackets), p50: " + "; ".join(parts) + " (target p50 <= 300 ms, fixed queries)"
    )
