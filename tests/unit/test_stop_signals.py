"""SIGTERM and SIGINT stop a process whatever its main thread holds (``gpustack_models.stop_signals``): the handler
takes no lock, so a signal arriving while the main thread holds the stop event's lock (inside its ``wait`` or
``set``, or inside an earlier handler) cannot hang it, as it hung a node plugin that got two SIGTERMs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from gpustack_models.stop_signals import on_stop_signals

CHILD = """
import os, signal, threading
from gpustack_models.stop_signals import on_stop_signals

stopping = threading.Event()
{install}
with stopping._cond:  # the event's lock, as its set() and wait() hold it
    print("locked", flush=True)
    os.kill(os.getpid(), {signal})  # the handler runs now, in this thread, while it holds the lock
print("handled", flush=True)
stopping.wait()
print("stopped", flush=True)
"""
SAFE = "on_stop_signals(stopping.set)"
# What the roles did before: Event.set in the handler itself.
LOCKING = "for s in (signal.SIGTERM, signal.SIGINT): signal.signal(s, lambda *_: stopping.set())"


def run_script(script: str, timeout: float) -> tuple[str, str, int | None]:
    """The child's stdout and stderr, and its exit status (None, and "hung" after its stdout, if it had not
    exited after ``timeout`` seconds: it is killed then)."""
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
    )
    try:
        out, err = child.communicate(timeout=timeout)
        return out, err, child.returncode
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        return out + "hung", err, None


def run_child(install: str, sig: signal.Signals, timeout: float = 10) -> str:
    """The child's output; "hung" after what it printed if it had not exited after ``timeout`` seconds."""
    return run_script(CHILD.format(install=install, signal=f"signal.{sig.name}"), timeout)[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_the_main_thread_holds_the_events_lock_stops_the_process(sig):
    assert run_child(SAFE, sig).split() == ["locked", "handled", "stopped"]


def test_the_handler_that_sets_the_event_itself_hangs_there():
    """The control: the same moment hangs the handler the roles had (the signal reaches the window)."""
    assert run_child(LOCKING, signal.SIGTERM, timeout=3).split() == ["locked", "hung"]


def test_the_callback_runs_in_a_thread_of_its_own_and_in_handler_in_the_handler(monkeypatch):
    ran = threading.Event()
    threads = []
    handled = []
    monkeypatch.setattr(signal, "signal", lambda sig, handler: handled.append((sig, handler)))
    on_stop_signals(lambda: (threads.append(threading.current_thread().name), ran.set()), in_handler=lambda: 1 / 0)
    assert [sig for sig, _ in handled] == [signal.SIGTERM, signal.SIGINT]
    with pytest.raises(ZeroDivisionError):  # in_handler runs in the handler (raising, as runlocal's start does)
        handled[0][1](signal.SIGTERM, None)
    assert ran.wait(5) and threads == ["stop-signals"]
    handled.clear()
    on_stop_signals(lambda: None)
    for _ in range(100_000):  # more than the pipe holds before the relay reads: the handler never blocks
        handled[1][1](signal.SIGINT, None)


HANGING_STOP = """
import logging, os, signal, threading
from gpustack_models.stop_signals import on_stop_signals

logging.basicConfig(level=logging.INFO)
stopping = threading.Event()
on_stop_signals(stopping.set, deadline={deadline})
os.kill(os.getpid(), signal.SIGTERM)
stopping.wait()
print("stopping", flush=True)
threading.Event().wait()  # a stop step that never returns
"""


def test_a_stop_that_hangs_ends_at_the_deadline_with_every_threads_stack():
    out, err, status = run_script(HANGING_STOP.format(deadline=0.5), timeout=20)
    assert (status, out.split()) == (1, ["stopping"]), (status, out, err[-2000:])
    assert "stop signal received" in err and "not stopped 0.5 s after the stop signal" in err, err[-2000:]
    # the stack of the main thread, stopped in the step that hung (faulthandler: "File ..., line N in <module>")
    assert "Current thread" in err or "Thread 0x" in err, err[-2000:]
    assert "line 11 in <module>" in err, err[-2000:]
