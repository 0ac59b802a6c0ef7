"""Lanes: the suite split into several pytest processes that run at once (``python -m tests.lanes``).

Each lane has its own state directory (``.local/test/lane-<i>``), its own test database (``test_<name>_lane<i>``),
its own Redis databases (``LANE_REDIS_DATABASES`` from ``lane * LANE_REDIS_DATABASES``), and its own range of
loopback ports (``GPUSTACK_LOCAL_PORTS``, set by the runner, honoured by every ``free_port``), so two lanes
never share a control plane, a worker, a hub or a port. The runner sets ``GPUSTACK_TEST_LANE`` and
``GPUSTACK_TEST_LANES``; a plain ``pytest`` is lane 0 of 1 and runs everything.

Which lane runs a test file is decided here, the same way in every lane: the files' measured seconds
(``tests/durations.json``, written by ``python -m tests.lanes --record``) are dealt out longest first to the
lane with the least work so far. The files whose tests use the real node (a host-wide lock: one real node on
a host at a time) all go to lane 0, and so does every file that builds the product's image.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DURATIONS = REPO / "tests" / "durations.json"
LANE = int(os.environ.get("GPUSTACK_TEST_LANE") or 0)
LANES = int(os.environ.get("GPUSTACK_TEST_LANES") or 1)
LANE_REDIS_DATABASES = 4  # per lane: the session's broker, then databases tests empty and use alone
PINNED_FIXTURES = ("real_node", "product_image")  # host-wide or too heavy to run twice: lane 0
UNKNOWN_TEST_SECONDS = 2.0  # a test not measured yet


def state_dir(lane: int | None = None) -> Path:
    return REPO / ".local" / "test" / f"lane-{LANE if lane is None else lane}"


def port_range(lane: int) -> tuple[int, int]:
    """Lane ``lane``'s loopback ports: below the kernel's ephemeral range, so no client socket takes one."""
    first = 20000 + lane * 2000
    return first, first + 1999


def redis_url(base: str, index: int, lane: int | None = None) -> str:
    """``base`` (a Redis URL) at the lane's database ``index`` (0: the session's broker; this lane's by default)."""
    if not 0 <= index < LANE_REDIS_DATABASES:
        raise ValueError(f"a lane has Redis databases 0..{LANE_REDIS_DATABASES - 1}, not {index}")
    root = base.rstrip("/")
    head, _, tail = root.rpartition("/")
    if tail.isdigit() and head.count("/") >= 2:
        root = head
    return f"{root}/{(LANE if lane is None else lane) * LANE_REDIS_DATABASES + index}"


def measured() -> dict[str, float]:
    try:
        return {k: float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def assign(files: dict[str, dict], lanes: int, seconds: dict[str, float]) -> dict[str, int]:
    """Each file's lane: ``files`` maps a file to ``{"tests": count, "pinned": bool}``; ``seconds`` to its
    measured time. Pinned files go to lane 0; the rest longest first to the least loaded lane."""
    load = [0.0] * lanes
    out: dict[str, int] = {}

    def weight(name):
        return seconds.get(name, files[name]["tests"] * UNKNOWN_TEST_SECONDS)

    for name in sorted(files, key=lambda n: (not files[n]["pinned"], -weight(n), n)):
        lane = 0 if files[name]["pinned"] else min(range(lanes), key=lambda i: (load[i], i))
        out[name] = lane
        load[lane] += weight(name)
    return out


def file_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


def select(config, items) -> None:
    """Keep this lane's files (``pytest_collection_modifyitems``)."""
    if LANES <= 1:
        return
    files: dict[str, dict] = defaultdict(lambda: {"tests": 0, "pinned": False})
    for item in items:
        entry = files[file_of(item)]
        entry["tests"] += 1
        entry["pinned"] |= bool(set(PINNED_FIXTURES) & set(getattr(item, "fixturenames", ())))
    lanes = assign(dict(files), LANES, measured())
    keep = [item for item in items if lanes[file_of(item)] == LANE]
    dropped = [item for item in items if lanes[file_of(item)] != LANE]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
