"""Stopping a process on SIGTERM and SIGINT with no lock taken in the signal handler.

Python runs a signal handler in the main thread between two of its bytecodes. A handler that calls
``threading.Event.set`` takes the event's lock; if the main thread already holds it (it was inside that
event's ``wait`` or ``set``, or a second signal arrived while the first handler held it), the handler waits
for a lock its own thread holds and the process never stops: a second SIGTERM, or Ctrl-C pressed twice,
hung a node plugin that way. Here the handler only writes a byte to a pipe; a thread of its own reads it and
runs the callback, where taking locks is safe.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(callback: Callable[[], None], signals=STOP_SIGNALS, in_handler: Callable[[], None] | None = None):
    """Run ``callback`` in a thread of its own at each of ``signals`` (call from the main thread).
    ``in_handler``, if given, runs in the handler itself first: it must take no lock (raising is fine)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def relay():
        while os.read(read_end, 1):
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
