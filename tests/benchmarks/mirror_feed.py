"""Watch events at an exact steady rate into the informers' own handler, for the mirror benchmark.

kube-apiserver on this two-core machine, beside etcd, PostgreSQL, Redis, the Celery worker and the load's
own clients, does not reach 1,000 changes a second; the mirror's side of the pipeline is measured here
without it. A process of its own (the informers' environment) builds the ``Informer`` for modelartifacts
with the sink the settings choose (``GPUSTACK_INFORMER_BATCH_*``) and hands it ``MODIFIED`` events at
``start + i / rate``: copies of one real resolved artifact under the names given, each with a label and a
resourceVersion above anything kube-apiserver has written, so every one is applied. From there on it is
the product's own path: the sink's coalescing, the Celery broker, the Celery worker's mirror task, PostgreSQL,
and the lag line written at the commit.

Usage: ``python -m tests.benchmarks.mirror_feed RATE SECONDS FIRST_RV < template.json``, names on the
template's ``names`` key; prints ``{"achieved": events per second, "events": n}``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def _event(template: dict, name: str, rv: int, i: int) -> dict:
    obj = copy.deepcopy(template)
    meta = obj["metadata"]
    meta.update(name=name, resourceVersion=str(rv), uid=f"feed-{name}", labels={"n": str(i)})
    return obj


def main(rate: float, seconds: float, first_rv: int) -> None:
    import django

    django.setup()
    from gpustack_models.informers.listwatch import Informer
    from gpustack_models.kube.watch import WatchTarget

    given = json.load(sys.stdin)
    template, names = given["object"], given["names"]
    informer = Informer("modelartifacts", WatchTarget("/unused"))
    total = int(rate * seconds)
    started = time.monotonic()
    for i in range(total):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        informer.event("MODIFIED", _event(template, names[i % len(names)], first_rv + i, i))
    achieved = total / max(time.monotonic() - started, 1e-9)
    informer.close()
    print(json.dumps({"achieved": achieved, "events": total}))


if __name__ == "__main__":
    main(float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]))
