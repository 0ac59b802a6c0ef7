"""The chaos run: the whole product (two API replicas, informers and beat electing leaders, a Celery worker,
five node plugins, its own PostgreSQL and Redis) busy with artifacts across five tenants, downloading,
prefetched and mounted through the CSI socket, while faults are injected one at a time; after each round and
at the end the invariants of ``tests/chaos/invariants.py`` are checked.

``make chaos`` (``GPUSTACK_CHAOS=full``): 50 artifacts, faults of every kind in random order for 20 minutes
(``GPUSTACK_CHAOS_SECONDS``; the seed is ``GPUSTACK_CHAOS_SEED``, printed). ``make test`` runs a short round:
five artifacts and four faults (a leader killed, the hub corrupting bodies, PostgreSQL restarted, a node's
clock stepped). Printed: each round's fault, how long the invariants took to hold again, the slowest
``progress``, and a count per kind; written as JSON to ``$GPUSTACK_CHAOS_DIR`` (default: the run's directory).
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from tests.chaos import invariants as check
from tests.chaos.chaos_stack import ChaosStack
from tests.chaos.faults import HUB_KINDS, KINDS, Injector
from tests.chaos.workload import Workload
from tests.support.paths import TEST_STATE
from tests.support.waiting import wait_for
from tests.support.worker import without_session_stack

FULL = os.environ.get("GPUSTACK_CHAOS") == "full"
SECONDS = float(os.environ.get("GPUSTACK_CHAOS_SECONDS", "1200")) if FULL else 0.0
TENANTS, PER_TENANT = (5, 10) if FULL else (5, 1)
SIZES = (2, 8) if FULL else (1, 2)  # MiB of each model's weights
HOLD = 8.0 if FULL else 3.0  # seconds each fault lasts before it is mended
BITE = 60.0  # the most seconds a fault that changed nothing yet is held for
SMOKE = ("kill-leader", "hub-corrupt", "postgres", "clock-jump")
CONVERGE = 180.0  # seconds the invariants that follow the cluster may take to hold again after a round


@dataclass
class Round:
    kind: str
    detail: str = ""
    seconds_to_hold: float = 0.0
    slowest_progress: float = 0.0
    problems: list[str] = field(default_factory=list)


@pytest.fixture
def chaos(cluster, hub, launcher, worker_api, core):
    """The chaos stack, the session's worker roles stopped meanwhile; the APIService given back after."""
    root = TEST_STATE / f"chaos-{uuid.uuid4().hex[:6]}"
    with without_session_stack():
        stack = ChaosStack(cluster, hub, root)
        try:
            yield stack.start()
        finally:
            hub.faults.clear()
            stack.stop()
            launcher.register(worker_api.port)
            launcher.wait_available()


def kinds(rng: random.Random):
    """Every kind in a random order, again and again: all of them come in any stretch of len(KINDS) rounds."""
    while True:
        order = list(KINDS)
        rng.shuffle(order)
        yield from order


def step(workload: Workload, rng: random.Random, kind: str) -> list:
    """The work a round adds: a new model prefetched to two nodes (the hub's traffic while a hub fault
    lasts), a prefetch gone now and then, a Pod mounting a model now and then."""
    new = workload.add_model()
    workload.prefetch(new, [p.node for p in workload.places(new, 2)])
    if kind not in HUB_KINDS and len(workload.prefetches) > len(workload.models) // 2 and rng.random() < 0.5:
        workload.unprefetch(rng.choice(sorted(workload.prefetches)))
    resolved = [m for m in workload.models if m.digest]
    if resolved and rng.random() < 0.4:
        mounted = rng.choice(resolved)
        workload.mount(mounted, workload.places(mounted, 1)[0])
    return [new]


def settle(stack: ChaosStack, workload: Workload, admin, since: float) -> tuple[list[str], float, float]:
    """The invariants after a round: (problems, seconds from ``since`` (the fault mended) until those that
    follow the cluster held, slowest progress answer). A wrong tree or a lost mount is a problem at once; the
    mirror and the stores' status get ``CONVERGE`` seconds to catch up."""
    kube = stack.launcher.admin

    def following():
        workload.try_mounts()
        found = check.status_matches_disk(kube, stack.plugins) + check.mirror_matches_relist(kube, stack.database_url)
        return not found or None

    try:
        wait_for(following, timeout=CONVERGE, interval=1.0, message="the mirror and the stores to match")
        problems = []
    except AssertionError:
        problems = check.status_matches_disk(kube, stack.plugins) + check.mirror_matches_relist(
            kube, stack.database_url
        )
    seconds = time.monotonic() - since
    problems += check.trees(stack.plugins, workload.by_digest())
    problems += check.mounts_hold(kube, workload.mounts)
    late, slowest = check.progress_answers(admin, stack.cluster.server, workload.models)
    return problems + late, seconds, slowest


def play(stack: ChaosStack, workload: Workload, injector: Injector, admin, kind: str) -> Round:
    round_ = Round(kind)
    new = step(workload, injector.rng, kind)
    injected = injector.inject(kind)
    started = time.monotonic()
    # The fault lasts HOLD seconds, longer (up to BITE) until it changed something (a hub fault waits for a
    # request to come); the kubelet keeps trying its mounts meanwhile.
    while time.monotonic() - started < HOLD or (not injected.bit and time.monotonic() - started < BITE):
        workload.try_mounts()
        time.sleep(0.5)  # the kubelet's pace between tries, not a wait for anything
    injected.mend()
    mended = time.monotonic()
    round_.detail = injected.outcome()
    stack.wait_healthy()
    workload.resolve(new)
    round_.problems, round_.seconds_to_hold, round_.slowest_progress = settle(stack, workload, admin, mended)
    if injected.problem:
        round_.problems.insert(0, injected.detail)
    return round_


HEADER = f"{'#':>3} {'fault':<15} {'recovered':>10} {'progress':>9}  detail"


def row(number: int, r: Round) -> str:
    flag = "" if not r.problems else f"  PROBLEMS: {r.problems[:3]}"
    return f"{number:>3} {r.kind:<15} {r.seconds_to_hold:>9.1f}s {r.slowest_progress:>8.2f}s  {r.detail}{flag}"


def report(rounds: list[Round], wanted: int, final: list[str], ended: float) -> str:
    lines = [HEADER] + [row(i, r) for i, r in enumerate(rounds, 1)] + [""]
    lines.append(f"{'fault':<15} {'rounds':>6} {'clean':>6} {'worst recovery':>17}")
    for kind in KINDS:
        mine = [r for r in rounds if r.kind == kind]
        if mine:
            clean = sum(not r.problems for r in mine)
            worst = max(r.seconds_to_hold for r in mine)
            lines.append(f"{kind:<15} {len(mine):>6} {clean:>6} {worst:>16.1f}s")
    lines.append(f"after the faults stopped: {wanted} wanted copies, {len(final)} not Ready; all Ready in {ended:.1f}s")
    return "\n".join(lines)


@pytest.mark.timeout(SECONDS + 1200 if FULL else 900)  # the run, then the stack's start and the last waits
def test_chaos(chaos, core, admin_http):
    seed = int(os.environ.get("GPUSTACK_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    print(f"\nchaos seed {seed} (GPUSTACK_CHAOS_SEED to replay the same faults in the same order)")
    rng = random.Random(seed)
    workload = Workload(chaos, core, rng, uuid.uuid4().hex[:5], SIZES)
    workload.create_tenants(TENANTS)
    try:
        models = [workload.add_model(ns) for ns in workload.tenants for _ in range(PER_TENANT)]
        workload.resolve(models)
        for model in models:
            workload.prefetch(model, [p.node for p in workload.places(model, 2)])
        for model in models[:: max(1, len(models) // 5)]:
            workload.mount(model, workload.places(model, 1)[0])
        injector, rounds, started = Injector(chaos, workload, rng), [], time.monotonic()
        print(HEADER, flush=True)
        for kind in kinds(rng) if FULL else SMOKE:
            rounds.append(play(chaos, workload, injector, admin_http, kind))
            print(row(len(rounds), rounds[-1]), flush=True)  # as it goes: the run is long
            if time.monotonic() - started >= SECONDS and len({r.kind for r in rounds}) == len(KINDS):
                break  # the run's time is up and every kind came at least once
        final, ended = finish(chaos, workload)
        text = report(rounds, len(workload.wanted()), final, ended)
        print(text)
        out = Path(os.environ.get("GPUSTACK_CHAOS_DIR") or chaos.root)
        out.mkdir(parents=True, exist_ok=True)
        (out / "chaos.json").write_text(json.dumps({"seed": seed, "rounds": [asdict(r) for r in rounds]}, indent=1))
    finally:
        workload.delete_tenants()
    assert not [r for r in rounds if r.problems], text
    assert not final, final
    assert all(r.slowest_progress < check.PROGRESS_SECONDS for r in rounds)


def finish(stack: ChaosStack, workload: Workload) -> tuple[list[str], float]:
    """Faults stopped: every wanted copy Ready, every mount in place. (what is still not, seconds waited)"""
    started = time.monotonic()

    def done():
        mounted = workload.try_mounts() == len(workload.mounts)
        return mounted and not check.wanted_ready(stack.launcher.admin, workload.wanted())

    try:
        wait_for(done, timeout=CONVERGE, interval=1.0, message="every wanted copy Ready")
    except AssertionError:
        pass
    missing = check.wanted_ready(stack.launcher.admin, workload.wanted())
    missing += [f"mount of {m.model.name} on {m.plugin.node}: {m.errors[-1:]}" for m in workload.mounts if not m.done]
    return missing, time.monotonic() - started
