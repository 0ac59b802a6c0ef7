"""A steady rate of real changes against kube-apiserver for the mirror benchmark, from several processes
(one Python process with threads tops out well below 1,000 PATCHes a second), and the lag read back.

Each process patches a label of every ``procs``-th change, each change at ``start + i / rate`` (sent at
once when the process falls behind, so the rate achieved is what it reports), from a pool of threads
over one keep-alive connection pool, and returns ``(name, resourceVersion, wall time)`` of each change.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

THREADS = 16


def _produce(kubeconfig, base, names, rate, seconds, index, procs, ready, go, start_at, out, bounded):
    from gpustack_models import kube

    client = kube.Kube(kube.load_configuration(kubeconfig), pool_size=THREADS)
    # bounded: at most a few calls per thread queued, and nothing sent after ``seconds`` (the soak's window)
    in_flight = threading.BoundedSemaphore(THREADS * 4) if bounded else None

    def change(i):
        name = names[i % len(names)]
        try:
            obj = client.json("PATCH", f"{base}/{name}", body={"metadata": {"labels": {"n": str(i)}}},
                              content_type="application/merge-patch+json")  # fmt: skip
        except Exception:
            if not bounded:
                raise
            return None  # the soak counts a change kube-apiserver did not take; the benchmark fails on it
        finally:
            if in_flight:
                in_flight.release()
        return name, int(obj["metadata"]["resourceVersion"]), time.time()

    with ThreadPoolExecutor(THREADS) as pool:
        ready.put(index)
        go.wait()
        futures = []
        for i in range(index, int(rate * seconds), procs):
            delay = start_at.value + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            if in_flight:
                in_flight.acquire()
                if time.time() >= start_at.value + seconds:
                    break
            futures.append(pool.submit(change, i))
        out.put([f.result() for f in futures])


@dataclass
class Load:
    writes: list  # (name, resourceVersion, wall time) of every change
    started: float  # wall time of the first scheduled change
    achieved: float  # changes per second the processes reached
    failed: int = 0  # changes kube-apiserver did not take (bounded runs only; otherwise they raise)


def run(kubeconfig: str, base: str, names: list[str], rate: int, seconds: float, procs: int, bounded=False) -> Load:
    """``rate * seconds`` label changes of ``names`` at ``rate`` a second from ``procs`` processes; ``bounded``:
    only those kube-apiserver takes within ``seconds`` (the rate reached says how many)."""
    ctx = multiprocessing.get_context("spawn")
    ready, out, go, start_at = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    shared = (ready, go, start_at, out, bounded)
    workers = [
        ctx.Process(target=_produce, args=(kubeconfig, base, names, rate, seconds, i, procs, *shared))
        for i in range(procs)
    ]
    for p in workers:
        p.start()
    try:
        for _ in workers:
            ready.get(timeout=120)
        start_at.value = time.time() + 0.2
        go.set()
        answers = [w for _ in workers for w in out.get(timeout=seconds + 300)]  # each returns at the end
        writes = [w for w in answers if w is not None]
    finally:
        for p in workers:
            p.join(10)
            if p.is_alive():
                p.kill()
    last = max(t for _, _, t in writes)
    return Load(writes, start_at.value, len(writes) / max(last - start_at.value, 1e-3), len(answers) - len(writes))


@dataclass
class Lags:
    events: int  # watch events accounted for
    p50_ms: float
    p99_ms: float

    def __str__(self):
        return f"p50 {self.p50_ms:.0f} ms, p99 {self.p99_ms:.0f} ms ({self.events} events)"


def lags(lag_file: Path, offset: int, key_prefix: str, since: float) -> Lags:
    """Arrival-to-commit lags of the events of ``key_prefix`` objects that arrived after ``since``,
    from the lines the mirror tasks appended after ``offset``; an entry standing for n coalesced events
    counts n times with the lag of the first of them (the longest)."""
    with open(lag_file, "rb") as f:
        f.seek(offset)
        lines = [json.loads(line) for line in f.read().splitlines() if line.strip()]
    samples = []
    for line in lines:
        if line["r"] == "modelartifacts" and line["k"].startswith(key_prefix) and line["a"] >= since:
            samples += [max(0.0, line["c"] - line["a"])] * line["n"]
    samples.sort()
    if not samples:
        return Lags(0, float("nan"), float("nan"))
    p99 = samples[max(0, int(len(samples) * 0.99) - 1)]
    return Lags(len(samples), statistics.median(samples) * 1000, p99 * 1000)
