"""Fan-out against every node from the hub, side by side in one run under the same hub throttle: time until
all eight nodes are Ready, and the bytes the hub served (targets: at most 1.3x the time one node alone takes
under the same throttle, at least 4x faster than every node from the hub, at most 1.05 copies)."""

import contextlib
import time

import pytest

from tests.test_fanout import all_ready, identical, model, size_of
from tests.test_plugins import Scenario

MiB = 1024 * 1024


@pytest.fixture
def bench(worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin):
    yield lambda: Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    hub.total_rate = 0


def run_side(make, hub, files, rate, *, nodes: int, fanout: bool, name: str, profiled=None) -> tuple[float, int]:
    scenario = make()
    scenario.artifact(name=name, files=files)
    plugins = scenario.plugins(nodes, GPUSTACK_PLUGIN_FANOUT="true" if fanout else "false")
    hub.total_rate = rate
    hub.reset_body_bytes()
    started = time.monotonic()
    with profiled(plugins[-1].proc.pid, f"fanout-{name}-last-node") if profiled else contextlib.nullcontext():
        scenario.prefetch(plugins, name=name, artifact=name)
        all_ready(scenario, plugins, timeout=1800)
    elapsed = time.monotonic() - started
    served = hub.body_bytes
    hub.total_rate = 0
    assert all(identical(scenario, p) for p in plugins)
    for p in plugins:
        p.stop()
    return elapsed, served


def test_bench_fanout_vs_hub_only(bench, hub, bench_scale, record, profiled):
    full = bench_scale == "full"
    nodes, mb, rate = (8, 128, 16 * MiB) if full else (2, 4, 8 * MiB)  # smoke: does it work at all
    files_a, files_b = model(f"bench-fan-{time.time_ns()}", mb), model(f"bench-hub-{time.time_ns()}", mb)
    files_c = model(f"bench-one-{time.time_ns()}", mb)
    size = size_of(files_a)
    one_s, one_bytes = run_side(bench, hub, files_c, rate, nodes=1, fanout=True, name="alone")
    fan_s, fan_bytes = run_side(bench, hub, files_a, rate, nodes=nodes, fanout=True, name="fan", profiled=profiled)
    hub_s, hub_bytes = run_side(bench, hub, files_b, rate, nodes=nodes, fanout=False, name="hubonly")
    # Each side took time; fan-out took one copy from the hub at least, every node its own without it.
    assert one_s > 0 and fan_s > 0 and hub_s > 0 and one_bytes >= size
    assert size <= fan_bytes < hub_bytes and hub_bytes >= nodes * size, (fan_bytes, hub_bytes, size)
    record(
        f"fan-out, {nodes} nodes, {size / 1e6:.0f} MB model, hub throttled to {rate / 1e6:.0f} MB/s in total:"
        f" all Ready in {fan_s:.1f} s, {fan_s / one_s:.2f}x the {one_s:.1f} s one node alone takes (target <= 1.3),"
        f" vs {hub_s:.1f} s every node from the hub (x{hub_s / fan_s:.1f}, target >= 4);"
        f" hub served {fan_bytes / size:.2f} vs {hub_bytes / size:.2f} copies (target <= 1.05)"
    )
