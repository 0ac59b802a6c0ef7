"""Runs the suite in several lanes at once: one pytest process per lane, each on its own state directory,
test database, Redis databases and range of ports (``tests/support/lanes.py`` says which lane runs which
file).

    python -m tests.lanes [--lanes N] [-- PYTEST_ARGS...]   # N: GPUSTACK_TEST_LANES, default 2
    python -m tests.lanes --record                          # the last run's per-file seconds -> tests/durations.json

Each lane's output goes to ``.local/test/lane-<i>/pytest.log`` and, line by line with its lane's prefix, to
this process's output; each lane's summary is printed again at the end. The exit status is the first
failing lane's (a lane left without tests by a selection counts as passing).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from tests.support import lanes as lane_rules

NO_TESTS = 5  # pytest's exit status when a selection leaves a lane nothing to run


def lane_env(lane: int, count: int) -> dict:
    env = dict(os.environ)
    first, last = lane_rules.port_range(lane)
    env.update(
        GPUSTACK_TEST_LANE=str(lane),
        GPUSTACK_TEST_LANES=str(count),
        GPUSTACK_LOCAL_PORTS=f"{first}-{last}",
        PYTHONUNBUFFERED="1",
    )
    broker = env.get("CELERY_BROKER_URL", "")
    if broker.startswith("redis"):
        env["CELERY_BROKER_URL"] = lane_rules.redis_url(broker, 0, lane=lane)
    return env


class Lane:
    def __init__(self, lane: int, count: int, pytest_args: list[str]):
        self.lane = lane
        self.dir = lane_rules.state_dir(lane)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "pytest.log"
        argv = [sys.executable, "-m", "pytest", "--color=no", *pytest_args]
        self.started = time.monotonic()
        self.ended: float | None = None
        self.proc = subprocess.Popen(
            argv,
            cwd=lane_rules.REPO,
            env=lane_env(lane, count),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # signals reach it from here only, once
        )
        self.tail: list[str] = []
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        prefix = f"[lane {self.lane}] "
        with self.log_path.open("w") as log:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                log.write(line)
                log.flush()
                self.tail = (self.tail + [line])[-60:]
                sys.stdout.write(prefix + line)
                sys.stdout.flush()
        self.ended = time.monotonic()

    def wait(self) -> int:
        code = self.proc.wait()
        self.thread.join()
        return code

    def interrupt(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # pytest tears its fixtures down on SIGINT

    def summary(self) -> list[str]:
        """The lines from pytest's short summary on (its last section)."""
        for i, line in enumerate(self.tail):
            if "short test summary info" in line:
                return self.tail[i:]
        return self.tail[-1:]


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def run(count: int, pytest_args: list[str]) -> int:
    started = time.monotonic()
    lanes = [Lane(i, count, pytest_args) for i in range(count)]

    def stop(*_):
        for lane in lanes:
            lane.interrupt()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    codes = [lane.wait() for lane in lanes]
    print()
    for lane, code in zip(lanes, codes):
        took = (lane.ended or time.monotonic()) - lane.started
        print(f"=== lane {lane.lane}: exit {code} in {minutes(took)} ({lane.log_path})")
        sys.stdout.writelines(lane.summary())
    total = time.monotonic() - started
    print(f"=== {count} lanes in {minutes(total)}")
    if all(code == NO_TESTS for code in codes):
        return NO_TESTS
    failing = [code for code in codes if code not in (0, NO_TESTS)]
    return failing[0] if failing else 0


def record(count: int) -> None:
    """Merge the lanes' per-file seconds of the last run into tests/durations.json."""
    seconds = lane_rules.measured()
    for lane in range(count):
        path = lane_rules.state_dir(lane) / "durations.json"
        if path.exists():
            seconds.update(json.loads(path.read_text()))
    lane_rules.DURATIONS.write_text(json.dumps(dict(sorted(seconds.items())), indent=1) + "\n")
    print(f"wrote {len(seconds)} files' seconds to {lane_rules.DURATIONS}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lanes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=int(os.environ.get("GPUSTACK_TEST_LANES") or 2))
    parser.add_argument("--record", action="store_true", help="write the last run's seconds per file")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    if args.lanes < 1 or args.lanes * 2000 + 20000 > 32768:
        parser.error("--lanes: 1 to 6")
    if args.record:
        record(args.lanes)
        return 0
    return run(args.lanes, args.pytest_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
