"""Stopping a process on SIGTERM and SIGINT with no lock taken in the signal handler.

Python runs a signal handler in the main thread between two of its bytecodes. A handler that calls
``threading.Event.set`` takes the event's lock; if the main thread already holds it (it was inside that
event's ``wait`` or ``set``, or a second signal arrived while the first handler held it), the handler waits
for a lock its own thread holds and the process never stops: a second SIGTERM, or Ctrl-C pressed twice,
hung a node plugin that way. Here the handler only writes a byte to a pipe; a thread of its own reads it and
runs the callback, where taking locks is safe.

A role given a ``deadline`` cannot hang in its stop either: at the first signal a watchdog starts, and if the
process is still running when the deadline passes it writes every thread's stack to stderr (which step of the
stop hung) and exits with status 1, as a kill after the grace period would, but with the reason in the log.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(
    callback: Callable[[], None],
    signals=STOP_SIGNALS,
    in_handler: Callable[[], None] | None = None,
    deadline: float | None = None,
):
    """Run ``callback`` in a thread of its own at each of ``signals`` (call from the main thread).
    ``in_handler``, if given, runs in the handler itself first: it must take no lock (raising is fine).
    ``deadline``: seconds after the first signal at which a process still running exits (``exit_after``)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def relay():
        first = True
        while os.read(read_end, 1):
            if first and deadline is not None:
                log.info("stop signal received: stopping (at most %g s)", deadline)
                exit_after(deadline)
            first = False
            callback()

    threading.Thread(target=relay, name="stop-signals", daemon=True).start()

    def handler(signum, frame):
        try:
            os.write(write_end, b"\0")
        except BlockingIOError:  # thousands of signals not yet relayed: one more changes nothing
            pass
        if in_handler is not None:
            in_handler()

    for sig in signals:
        signal.signal(sig, handler)


def exit_after(seconds: float) -> threading.Thread:
    """A daemon thread that, unless the process has ended ``seconds`` from now, writes every thread's stack to
    stderr and exits the process with status 1 (no cleanup runs: what it would wait for is what hung)."""

    def watch():
        threading.Event().wait(seconds)
        log.error("not stopped %g s after the stop signal: exiting; every thread's stack follows", seconds)
        for handler in logging.getLogger().handlers:
            handler.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(1)

    thread = threading.Thread(target=watch, name="stop-deadline", daemon=True)
    thread.start()
    return thread
