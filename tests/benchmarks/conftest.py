"""Benchmarks run inside the test stack (control plane, worker, databases) as pytest items.

``make test`` runs each in a tiny smoke mode (does it work at all); ``make bench`` runs them at full
size (``GPUSTACK_BENCH=full``). Each records its result lines, after checking the values in them (rates
and times positive, p50 at most p99, counts what was asked); a benchmark that records none fails. The
lines are printed together at the end of the run so ratios measured side by side read side by side.
"""

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

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


def hottest(folded: Path, top: int = 8) -> list[str]:
    """The functions most often on top of the stack (self samples) in py-spy's collapsed-stack output."""
    samples: collections.Counter = collections.Counter()
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        samples[stack.rsplit(";", 1)[-1]] += int(count)
        total += int(count)
    return [f"{100 * n / total:5.1f}% {frame}" for frame, n in samples.most_common(top)] if total else []


@pytest.fixture
def profiled():
    """``with profiled(pid, name):`` samples the threads of process ``pid`` and its children that hold the
    interpreter lock (where their Python time goes) while the block runs, into
    ``$GPUSTACK_PROFILE_DIR/<name>.folded`` (collapsed stacks: what flame graph tools draw) and prints the
    hottest functions; nothing without that variable. ``py-spy`` comes from the development requirements
    and needs ptrace rights over the process."""
    out = os.environ.get("GPUSTACK_PROFILE_DIR")

    @contextlib.contextmanager
    def run(pid: int, name: str):
        if not out:
            yield
            return
        Path(out).mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).with_name("py-spy")
        target = Path(out) / f"{name}.folded"
        args = [str(spy), "record", "--pid", str(pid), "--threads", "--subprocesses", "--gil", "--rate", "100"]
        args += ["--format", "raw"]
        proc = subprocess.Popen([*args, "-o", str(target)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGINT)  # py-spy writes what it sampled on SIGINT
            proc.wait(timeout=60)
            print(f"profile of {name} (pid {pid}): {target}", *hottest(target), sep="\n  ")

    return run
