"""Fan-out against every node from the hub, side by side in one run under the same hub throttle: time until
all eight nodes are Ready, and the bytes the hub served (target: at least 4x faster, at most 1.1 copies)."""

import time

import pytest

from tests.test_fanout import all_ready, identical, model, size_of
from tests.test_plugins import Scenario

MiB = 1024 * 1024


@pytest.fixture
def bench(worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin):
    yield lambda: Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    hub.total_rate = 0


def run_side(make, hub, files, rate, *, nodes: int, fanout: bool, name: str) -> tuple[float, int]:
    scenario = make()
    scenario.artifact(name=name, files=files)
    plugins = scenario.plugins(nodes, GPUSTACK_PLUGIN_FANOUT="true" if fanout else "false")
    hub.total_rate = rate
    hub.reset_body_bytes()
    started = time.monotonic()
    scenario.prefetch(plugins, name=name, artifact=name)
    all_ready(scenario, plugins, timeout=1800)
    elapsed = time.monotonic() - started
    served = hub.body_bytes
    hub.total_rate = 0
    assert all(identical(scenario, p) for p in plugins)
    for p in plugins:
        p.stop()
    return elapsed, served


def test_bench_fanout_vs_hub_only(bench, hub, bench_scale, record):
    full = bench_scale == "full"
    nodes, mb, rate = (8, 128, 16 * MiB) if full else (2, 4, 8 * MiB)  # smoke: does it work at all
    files_a, files_b = model(f"bench-fan-{time.time_ns()}", mb), model(f"bench-hub-{time.time_ns()}", mb)
    size = size_of(files_a)
    fan_s, fan_bytes = run_side(bench, hub, files_a, rate, nodes=nodes, fanout=True, name="fan")
    hub_s, hub_bytes = run_side(bench, hub, files_b, rate, nodes=nodes, fanout=False, name="hubonly")
    # Each side took time; fan-out took one copy from the hub at least, every node its own without it.
    assert fan_s > 0 and hub_s > 0
    assert size <= fan_bytes < hub_bytes and hub_bytes >= nodes * size, (fan_bytes, hub_bytes, size)
    record(
        f"fan-out, {nodes} nodes, {size / 1e6:.0f} MB model, hub throttled to {rate / 1e6:.0f} MB/s in total:"
        f" all Ready in {fan_s:.1f} s vs {hub_s:.1f} s every node from the hub (x{hub_s / fan_s:.1f}, target >= 4);"
        f" hub served {fan_bytes / size:.2f} vs {hub_bytes / size:.2f} copies (target <= 1.1)"
    )
