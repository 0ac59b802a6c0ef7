"""Benchmarks run inside the test stack (control plane, worker, databases) as pytest items.

``make test`` runs each in a tiny smoke mode (does it work at all); ``make bench`` runs them at full
size (``GPUSTACK_BENCH=full``). Each records one result line; the lines are printed together at the end
of the run so ratios measured side by side read side by side.
"""

import os

import pytest

RESULTS: list[str] = []


@pytest.fixture
def bench_scale():
    return os.environ.get("GPUSTACK_BENCH", "smoke")


@pytest.fixture
def record():
    def add(line: str) -> None:
        RESULTS.append(line)
        print(line)

    return add


def pytest_terminal_summary(terminalreporter):
    if RESULTS:
        terminalreporter.section(f"benchmarks ({os.environ.get('GPUSTACK_BENCH', 'smoke')})")
        for line in RESULTS:
            terminalreporter.write_line(line)
