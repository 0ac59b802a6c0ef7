"""Fill (or empty) the mirror with many nodes for the progress benchmark, in a process of its own so the
rows are committed for the worker to read.

    python -m tests.benchmarks.mirror_fill fill PREFIX DIGEST NODES HOLDING DOWNLOADING LIVE_ADDRESS...
    python -m tests.benchmarks.mirror_fill clear PREFIX
"""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django

django.setup()

from gpustack_models.models import Holding, NodeStore, PluginPod, StoreEntry  # noqa: E402

FAR_FUTURE_RV = 10**15  # newer than anything a relist could prune


def fill(prefix, digest, nodes, holding, downloading, addresses):
    size = 10 * 1024**3
    NodeStore.objects.bulk_create(
        [NodeStore(name=f"{prefix}-{i:05d}", resource_version=FAR_FUTURE_RV, body={}) for i in range(nodes)],
        batch_size=2000,
    )
    stores = dict(NodeStore.objects.filter(name__startswith=prefix).values_list("name", "id"))
    entries = []
    for i in range(holding):
        name = f"{prefix}-{i:05d}"
        state = "Downloading" if i < downloading else "Ready"
        done = size // 3 if state == "Downloading" else size
        entries.append(
            StoreEntry(
                store_id=stores[name], node=name, digest=digest, state=state, size_bytes=size, downloaded_bytes=done
            )
        )
    StoreEntry.objects.bulk_create(entries, batch_size=2000)
    Holding.objects.bulk_create([Holding(node=e.node, digest=digest) for e in entries], batch_size=2000)
    PluginPod.objects.bulk_create(
        [
            PluginPod(
                namespace="bench",
                name=f"{prefix}-{i:05d}",
                node=f"{prefix}-{i:05d}",
                pod_ip=address,
                ready=True,
                resource_version=FAR_FUTURE_RV,
                body={},
            )
            for i, address in enumerate(addresses)
        ],
        batch_size=2000,
    )


def clear(prefix):
    StoreEntry.objects.filter(node__startswith=prefix).delete()
    Holding.objects.filter(node__startswith=prefix).delete()
    NodeStore.objects.filter(name__startswith=prefix).delete()
    PluginPod.objects.filter(name__startswith=prefix).delete()


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "fill":
        prefix, digest = sys.argv[2], sys.argv[3]
        nodes, holding, downloading = map(int, sys.argv[4:7])
        fill(prefix, digest, nodes, holding, downloading, sys.argv[7:])
    else:
        clear(sys.argv[2])
