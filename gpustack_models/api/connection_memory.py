"""What each open TLS connection costs an API worker in memory: less, and given back when it closes.

Every TLS connection asyncio serves or opens holds a read buffer of ``SSLProtocol.max_size`` bytes (256 KiB in
Python 3.11), allocated zero-filled when the connection opens and kept until it closes. An API worker holds
many: kube-apiserver's proxy keeps hundreds of connections open to each replica under load, and every relayed
watch holds one more to kube-apiserver. At 256 KiB each, 700 connections are 175 MB. And glibc raises its
mmap threshold past a freed 256 KiB block, so later buffers come from the heap, where the connections that
come and go (watches end and are opened again) leave holes that other allocations fill: the worker's resident
memory kept rising for minutes after its number of connections had stopped changing (the soak's API slope).

``apply`` (each API worker, at its start):
- a read buffer of 64 KiB: a TLS record carries at most 16 KiB, so reads still take several records at once;
- allocations of 64 KiB and more in their own mappings (glibc's ``M_MMAP_THRESHOLD``, fixed: no longer raised
  by a free), so a closed connection's buffer goes back to the system instead of fragmenting the heap. A
  response body of that size pays a mapping too (microseconds; the API's answers take milliseconds);
- two malloc arenas, not glibc's up to eight per core: the worker's 64 view threads spread their allocations
  over that many, and memory freed in one arena is not reused by a thread allocating in another. Python
  allocates under its GIL, so more arenas spare no contention.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from asyncio import sslproto

log = logging.getLogger(__name__)

READ_BUFFER_BYTES = 64 * 1024
ARENAS = 2
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc's mallopt parameters (malloc.h)


def apply() -> bool:
    """Set the read buffer of this process's TLS connections, glibc's mmap threshold and its arenas (before
    the process starts threads); whether glibc took them (False where the C library is not glibc: the buffer
    is smaller all the same)."""
    sslproto.SSLProtocol.max_size = READ_BUFFER_BYTES
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None or (mallopt(M_MMAP_THRESHOLD, READ_BUFFER_BYTES), mallopt(M_ARENA_MAX, ARENAS)) != (1, 1):
        log.info("glibc's malloc settings not taken (another C library?): buffers are allocated as it does")
        return False
    return True
