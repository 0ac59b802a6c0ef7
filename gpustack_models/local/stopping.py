"""Stopping local processes together within one deadline: SIGTERM to all of them at once, SIGKILL to
what is left when the deadline passes (``make run``, ``localcluster stop`` and the test stack)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

Target = subprocess.Popen | int  # a child of this process, or any process by its id


def alive(target: Target) -> bool:
    if isinstance(target, subprocess.Popen):
        return target.poll() is None
    try:
        state = Path(f"/proc/{target}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has stopped; its parent reaps it


def send(target: Target, sig: int) -> None:
    try:
        if isinstance(target, subprocess.Popen):
            if target.poll() is None:
                target.send_signal(sig)
        else:
            os.kill(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all(targets: Iterable[Target], deadline: float) -> list[Target]:
    """SIGTERM every target, wait until they are gone or ``deadline`` (``time.monotonic()``), SIGKILL
    the rest; returns those killed."""
    targets = [t for t in targets if alive(t)]
    for target in targets:
        send(target, signal.SIGTERM)
    while any(alive(t) for t in targets) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = [t for t in targets if alive(t)]
    for target in killed:
        send(target, signal.SIGKILL)
    for target in killed:
        if isinstance(target, subprocess.Popen):
            try:
                target.wait(2)
            except subprocess.TimeoutExpired:
                pass
    return killed


def kill_group(pgid: int) -> None:
    """SIGKILL whatever is left in process group ``pgid`` (the children of a stopped leader)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def die_with_parent() -> None:
    """In a child before exec: SIGTERM when the process that started it dies (``PR_SET_PDEATHSIG``)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)
