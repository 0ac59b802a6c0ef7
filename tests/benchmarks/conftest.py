"""Benchmarks run inside the test stack (control plane, worker, databases) as pytest items.

``make test`` runs each in a tiny smoke mode (does it work at all); ``make bench`` runs them at full
size (``GPUSTACK_BENCH=full``). Each records its result lines, after checking the values in them (rates
and times positive, p50 at most p99, counts what was asked); a benchmark that records none fails. The
lines are printed together at the end of the run so ratios measured side by side read side by side.
"""

import os
import re

import pytest

RESULTS: list[str] = []


@pytest.fixture
def bench_scale():
    return os.environ.get("GPUSTACK_BENCH", "smoke")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.bench_call = report
    return report


@pytest.fixture
def record(request):
    recorded = []

    def add(line: str) -> None:
        assert line and not re.search(r"\b(nan|inf)\b", line), line
        recorded.append(line)
        RESULTS.append(line)
        print(line)

    yield add
    call = getattr(request.node, "bench_call", None)
    if call is not None and call.passed:
        assert recorded, "the benchmark recorded no result"


def pytest_terminal_summary(terminalreporter):
    if RESULTS:
        terminalreporter.section(f"benchmarks ({os.environ.get('GPUSTACK_BENCH', 'smoke')})")
        for line in RESULTS:
            terminalreporter.write_line(line)
