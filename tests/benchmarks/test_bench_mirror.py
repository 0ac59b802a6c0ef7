"""Informer event to mirror row: the lag from an event's arrival at the informer to the commit of its row,
at steady rates of real changes, with the informers batching (the default) and with one Celery task per
event (``GPUSTACK_INFORMER_BATCH_SIZE=1``, the informers restarted), side by side in one run; the smoke run
(``make test``) measures the batching informers alone, as the suite runs them.

How it is measured: the Celery worker appends a line per event it applied (``GPUSTACK_MIRROR_LAG_FILE``)
with the event's arrival at the informer and the commit of its row, both wall-clock times on this one
machine; an entry standing for several coalesced events counts once per event, with the lag of the first
of them. Every change the load made must be accounted for. The load is label PATCHes of ``objects``
artifacts from several processes (``mirror_load``); when they cannot reach a rate on this machine the line
says the rate they reached.
"""

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kubernetes import client as k8s

from gpustack_models.kinds import GROUP
from gpustack_models.models import Artifact, InformerState
from tests.benchmarks import mirror_load
from tests.support import wait_for
from tests.support.paths import REPO
from tests.support.worker import MIRROR_LAG_FILE

BATCH_SETTINGS = ("GPUSTACK_INFORMER_BATCH_SIZE", "GPUSTACK_INFORMER_BATCH_SECONDS")
MODES = (("per-event", {"GPUSTACK_INFORMER_BATCH_SIZE": "1"}), ("batched", {}))


def restart_informers(worker_stack, monkeypatch, env: dict) -> None:
    """The suite's informers again with ``env`` (batch settings otherwise default), once they listed."""
    for name in BATCH_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    worker_stack.stop("informers")
    relists = dict(InformerState.objects.values_list("resource", "relists"))
    worker_stack.start("informers")
    wait_for(lambda: all(InformerState.objects.get(resource=r).relists > n for r, n in relists.items()),
             timeout=120, message="the informers to list again")  # fmt: skip


def measure(launcher, namespace, names, rate, seconds, procs):
    base = f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts"
    offset = MIRROR_LAG_FILE.stat().st_size if MIRROR_LAG_FILE.exists() else 0
    load = mirror_load.run(str(launcher.service_kubeconfig), base, names, rate, seconds, procs)
    newest = {}
    for name, rv, _ in load.writes:
        newest[name] = max(rv, newest.get(name, 0))

    def caught_up():
        rows = dict(Artifact.objects.filter(namespace=namespace).values_list("name", "resource_version"))
        return all(rows.get(name, 0) >= rv for name, rv in newest.items())

    assert len(load.writes) == int(rate * seconds) and load.achieved > 0, (len(load.writes), load.achieved)
    wait_for(caught_up, timeout=300, interval=0.5, message="the mirror to catch up")
    lags = wait_for(
        lambda: (
            (found := mirror_load.lags(MIRROR_LAG_FILE, offset, f"{namespace}/", load.started - 0.05)).events
            >= len(load.writes)
            and found
        ),
        timeout=30,
        message="a lag line for every change",
    )
    # Every change accounted for once, each lag a commit after its arrival.
    assert lags.events == len(load.writes) and 0 <= lags.p50_ms <= lags.p99_ms, lags
    return load, lags


@pytest.fixture
def claim(core, namespace):
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
    return "models"


def test_bench_mirror_lag(worker_stack, worker_kube, launcher, claim, namespace, bench_scale, record, monkeypatch):
    full = bench_scale == "full"
    objects, rates, seconds, procs = (500, (200, 500, 1000), 5, 4) if full else (20, (50,), 1, 1)
    base = f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts"
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

    names = [f"b-{i:04d}" for i in range(objects)]
    # The smoke run measures the informers as the suite runs them (batched) and restarts nothing.
    modes = MODES if full else MODES[1:]
    results, restored = {}, True
    try:
        for mode, env in modes:
            restored = mode == "batched"
            if full:
                restart_informers(worker_stack, monkeypatch, env)
            for rate in rates:
                results[mode, rate] = measure(launcher, namespace, names, rate, seconds, procs)
    finally:
        if not restored:
            restart_informers(worker_stack, monkeypatch, {})
    for rate in rates:
        sides = []
        for mode, _ in modes:
            load, lags = results[mode, rate]
            sides.append(f"{mode} {lags} at {load.achieved:.0f}/s")
        record(f"mirror lag at {rate} changes/s ({objects} objects): " + " | ".join(sides)
               + " (target: batched p99 <= 500 ms at 1,000/s)")  # fmt: skip


def feed(worker_stack, namespace, template, names, rate, seconds, first_rv, env):
    """``mirror_feed`` at ``rate`` for ``seconds`` with the informers' environment and ``env``; the lags."""
    offset = MIRROR_LAG_FILE.stat().st_size if MIRROR_LAG_FILE.exists() else 0
    since = time.time()
    given = json.dumps({"object": template, "names": names})
    out = subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.mirror_feed", str(rate), str(seconds), str(first_rv)],
        input=given, capture_output=True, text=True, cwd=REPO, env={**worker_stack.env(), **env}, timeout=300,
        check=True,
    )  # fmt: skip
    fed = json.loads(out.stdout.strip().splitlines()[-1])
    assert fed["events"] == int(rate * seconds) and fed["achieved"] > 0, fed
    lags = wait_for(
        lambda: (
            (found := mirror_load.lags(MIRROR_LAG_FILE, offset, f"{namespace}/s-", since)).events >= fed["events"]
            and found
        ),
        timeout=120,
        interval=0.5,
        message="a lag line for every fed event",
    )
    assert lags.events == fed["events"] and 0 <= lags.p50_ms <= lags.p99_ms, (lags, fed)
    return fed["achieved"], lags


def test_bench_mirror_pipeline(worker_stack, worker_kube, claim, namespace, bench_scale, record):
    """The mirror's side alone at exact rates (``mirror_feed``): 200, 500 and 1,000 events/s, one Celery task
    per event vs batches, side by side."""
    full = bench_scale == "full"
    objects, rates, seconds = (500, (200, 500, 1000), 5) if full else (10, (50,), 1)
    base = f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts"
    worker_kube.create(base, {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": "t"},
                              "spec": {"source": {"persistentVolumeClaim": {"claimName": claim}}}})  # fmt: skip
    wait_for(lambda: Artifact.objects.live().filter(namespace=namespace, name="t", resolved_status="True").exists(),
             timeout=60, message="the template artifact resolved")  # fmt: skip
    template = worker_kube.get(f"{base}/t")
    names = [f"s-{i:04d}" for i in range(objects)]
    first_rv = 10**12  # above anything kube-apiserver writes in a test session
    feed(worker_stack, namespace, template, names, len(names), 1, first_rv, {})  # the rows exist before measuring
    first_rv += len(names)
    modes = MODES if full else MODES[1:]
    results = {}
    for mode, env in modes:
        for rate in rates:
            results[mode, rate] = feed(worker_stack, namespace, template, names, rate, seconds, first_rv, env)
            first_rv += int(rate * seconds)
    for rate in rates:
        sides = [f"{mode} {results[mode, rate][1]} at {results[mode, rate][0]:.0f}/s" for mode, _ in modes]
        record(f"mirror pipeline at {rate} events/s into the informer's handler ({objects} objects): "
               + " | ".join(sides) + " (target: batched p99 <= 500 ms at 1,000/s)")  # fmt: skip
