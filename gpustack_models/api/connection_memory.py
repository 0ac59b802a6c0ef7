"""What each open TLS connection costs an API worker in memory: less, and given back when it closes.

Every TLS connection asyncio serves or opens holds a read buffer of ``SSLProtocol.max_size`` bytes (256 KiB in
Python 3.11), allocated zero-filled when the connection opens and kept until it closes. An API worker holds
many: kube-apiserver's proxy keeps hundreds of connections open to each replica under load, and every relayed
watch holds one more to kube-apiserver. At 256 KiB each, 700 connections are 175 MB. And glibc raises its
mmap threshold past a freed 256 KiB block, so later buffers come from the heap, where the connections that
come and go (watches end and are opened again) leave holes that other allocations fill: the worker's resident
memory kept rising for minutes after its number of connections had stopped changing (the soak's API slope).

``apply`` (each API worker, at its start):
- one read buffer per thread, shared by every TLS connection its event loop serves, instead of one per
  connection. The buffer only passes bytes from the socket to the connection's TLS object: the event loop
  asks the protocol for it, reads the socket into it and hands the count back in one synchronous step, and
  the protocol copies the bytes out at once (``buffer_updated``), so no two connections of a thread ever use
  it at the same time. A worker holding 300 connections keeps 64 KiB of read buffer instead of 19 MB, and a
  connection that opens or closes allocates or frees none;
- a read buffer of 64 KiB: a TLS record carries at most 16 KiB, so reads still take several records at once;
- glibc's ``M_MMAP_THRESHOLD`` fixed at 64 KiB (no longer raised by a free): a block that large which the
  heap's free top cannot hold gets a mapping of its own, given back when freed, instead of growing the heap
  (glibc still serves any block its free top can hold from there);
- two malloc arenas, not glibc's up to eight per core: the worker's 64 view threads spread their allocations
  over that many, and memory freed in one arena is not reused by a thread allocating in another. Python
  allocates under its GIL, so more arenas spare no contention.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from asyncio import sslproto

log = logging.getLogger(__name__)

READ_BUFFER_BYTES = 64 * 1024
ARENAS = 2
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc's mallopt parameters (malloc.h)


_thread = threading.local()  # .read_buffer: the thread's, made on its first TLS read
_NO_BUFFER = memoryview(b"")
_own_init = sslproto.SSLProtocol.__init__


def thread_read_buffer() -> memoryview:
    """The read buffer of the TLS connections served in the current thread."""
    view = getattr(_thread, "read_buffer", None)
    if view is None:
        view = _thread.read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))
    return view


def _init_without_buffer(self, *args, **kwargs):
    self.max_size = 1  # the buffer asyncio's __init__ makes: 1 byte instead of max_size, dropped below
    try:
        _own_init(self, *args, **kwargs)
    finally:
        del self.max_size  # the class's again: how much one read of decrypted bytes takes
    self._ssl_buffer, self._ssl_buffer_view = None, _NO_BUFFER


def _shared_buffer(self, n):
    """``SSLProtocol.get_buffer``: the thread's buffer, which ``buffer_updated`` (unchanged) copies out of."""
    self._ssl_buffer_view = thread_read_buffer()
    return self._ssl_buffer_view


def share_read_buffers() -> bool:
    """Make every TLS connection of this process read through its thread's buffer; False (and nothing
    changed) where asyncio's TLS protocol is not the one this was written against."""
    cls = sslproto.SSLProtocol
    if cls.__init__ is _init_without_buffer:
        return True
    if not all(hasattr(cls, name) for name in ("get_buffer", "buffer_updated", "max_size")):
        log.info("asyncio's TLS protocol differs: each connection keeps a read buffer of its own")
        return False
    cls.__init__, cls.get_buffer = _init_without_buffer, _shared_buffer
    return True


def apply() -> bool:
    """Set the read buffer of this process's TLS connections (one per thread, of 64 KiB), glibc's mmap
    threshold and its arenas (before the process starts threads); whether glibc took them (False where the
    C library is not glibc: the buffers are shared all the same)."""
    sslproto.SSLProtocol.max_size = READ_BUFFER_BYTES
    share_read_buffers()
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None or (mallopt(M_MMAP_THRESHOLD, READ_BUFFER_BYTES), mallopt(M_ARENA_MAX, ARENAS)) != (1, 1):
        log.info("glibc's malloc settings not taken (another C library?): buffers are allocated as it does")
        return False
    return True
