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
  allocates under its GIL, so more arenas spare no contention;
- a connection's two OpenSSL memory BIOs (the bytes between the socket and its TLS object, one each way) kept
  small. A memory BIO never gives back what it grew to: its buffer keeps the size of the most it ever held
  until the connection closes. asyncio encrypts everything an answer writes into the outgoing BIO at once, and
  while the socket is slow (kube-apiserver busy) it stops moving that BIO to the socket but goes on encrypting
  into it until the answer's writer is paused at 512 KiB; and it writes each read of the socket, and while the
  application does not read everything it receives, into the incoming BIO. So every connection that once met a
  slow peer or a burst kept the 0.5-1 MB of that moment for its life: under the soak, the worker's memory rose
  for as long as connections kept meeting larger bursts. Now bytes pass through each BIO 16 KiB at a time
  (a TLS record's worth), each piece moved out before the next goes in; an answer's bytes waiting for a slow
  socket wait as Python bytes, freed once sent, as asyncio's flow control already counts them; and a
  connection whose application does not read pauses its socket at 32 KiB received instead of 256;
- the free pages inside glibc's heaps handed back to the system every second (``malloc_trim``, in a thread of
  its own). glibc gives back only the free top of a heap: a page freed below a block still in use stays resident
  until the heap reuses it (jemalloc and tcmalloc hand such pages back after a decay time; glibc never does).
  Under load the heaps' free space grows as connections and answers come and go (one worker's heap at 62.8 MB
  with 2.9 MB free, 65.4 MB with 7.3 MB free nine minutes later, the memory in use flat at 58 MB), so without
  it the worker's resident memory followed the most its heaps had ever been spread over, not what it uses. A
  pass takes about 1 ms for a heap of 60 MB and releases the GIL (threads allocating meanwhile wait for the
  heap's lock that long). Every second, not every 10: between two passes the heap touches freed pages again
  (up to 10 MB in 10 s under the soak), so a longer period makes resident memory a sawtooth that a sampler
  with a similar period reads at a drifting phase.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from asyncio import sslproto

log = logging.getLogger(__name__)

READ_BUFFER_BYTES = 64 * 1024
BIO_PIECE_BYTES = 16 * 1024  # a TLS record's payload: the most either memory BIO holds beyond a partial record
SEND_BYTES = 64 * 1024  # encrypted pieces joined into one socket write
INCOMING_HIGH_WATER = 32 * 1024  # received and not yet read by the application: the socket pauses past this
ARENAS = 2
TRIM_SECONDS = 1.0  # how often free heap pages go back to the system
M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc's mallopt parameters (malloc.h)


_thread = threading.local()  # .read_buffer: the thread's, made on its first TLS read
_NO_BUFFER = memoryview(b"")
_own_init = sslproto.SSLProtocol.__init__
_own_buffer_updated = sslproto.SSLProtocol.buffer_updated
_own_resume_writing = sslproto.SSLProtocol.resume_writing
_own_write_appdata = sslproto.SSLProtocol._write_appdata
_WRAPPED = sslproto.SSLProtocolState.WRAPPED


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
    self._set_read_buffer_limits(high=INCOMING_HIGH_WATER)


def _shared_buffer(self, n):
    """``SSLProtocol.get_buffer``: the thread's buffer, which ``buffer_updated`` (unchanged) copies out of."""
    self._ssl_buffer_view = thread_read_buffer()
    return self._ssl_buffer_view


def _buffer_updated_in_pieces(self, nbytes):
    """``SSLProtocol.buffer_updated`` (asyncio's, unchanged) for each 16 KiB of what the socket gave, as if it
    had come in reads that small: each piece is decrypted and handed on before the next enters the BIO."""
    view = self._ssl_buffer_view
    try:
        for start in range(0, nbytes, BIO_PIECE_BYTES):
            self._ssl_buffer_view = view[start : min(start + BIO_PIECE_BYTES, nbytes)]
            _own_buffer_updated(self, len(self._ssl_buffer_view))
    finally:
        self._ssl_buffer_view = view


def _write_in_pieces(self):
    """``SSLProtocol._do_write``: encrypt the application's waiting bytes 16 KiB at a time, each piece taken out of
    the outgoing BIO at once, and only while the socket takes more. What the socket cannot take yet waits in
    ``_write_backlog`` as the application's bytes (``resume_writing`` goes on). While the connection closes
    (flushing), everything is encrypted at once as asyncio does, so nothing written before the close_notify is
    left behind."""
    sending, size = [], 0
    try:
        while self._write_backlog and (not self._ssl_writing_paused or self._state != _WRAPPED):
            data = memoryview(self._write_backlog[0]).cast("B")
            count = self._sslobj.write(data[:BIO_PIECE_BYTES])
            if count < len(data):
                self._write_backlog[0] = data[count:]
            else:
                del self._write_backlog[0]
            self._write_buffer_size -= count
            if self._ssl_writing_paused:
                continue  # closing while the socket is full: the BIO holds it, as asyncio's own does
            sending.append(self._outgoing.read())
            size += len(sending[-1])
            if size >= SEND_BYTES:
                self._transport.write(b"".join(sending))  # may pause: the loop's condition sees it
                sending, size = [], 0
    except sslproto.SSLAgainErrors:
        pass
    finally:
        if sending:
            self._transport.write(b"".join(sending))
    self._process_outgoing()


def _write_appdata_immutable(self, list_of_data):
    """``SSLProtocol._write_appdata`` with a copy of what is not ``bytes``: bytes may now wait in the backlog
    after ``write`` returned, and a bytearray could change meanwhile (asyncio encrypted it at once)."""
    _own_write_appdata(self, [data if isinstance(data, bytes) else bytes(data) for data in list_of_data])


def _resume_writing_in_pieces(self):
    """``SSLProtocol.resume_writing``: the socket takes bytes again; encrypt what waited for it."""
    if self._write_backlog and self._state == _WRAPPED:
        self._ssl_writing_paused = False
        self._do_write()
    else:
        _own_resume_writing(self)


def share_read_buffers() -> bool:
    """Make every TLS connection of this process read through its thread's buffer; False (and nothing
    changed) where asyncio's TLS protocol is not the one this was written against."""
    cls = sslproto.SSLProtocol
    if cls.__init__ is _init_without_buffer:
        return True
    needed = (
        "get_buffer",
        "buffer_updated",
        "max_size",
        "_do_write",
        "_process_outgoing",
        "resume_writing",
        "_set_read_buffer_limits",
        "_write_appdata",
    )
    if not all(hasattr(cls, name) for name in needed):
        log.info("asyncio's TLS protocol differs: each connection keeps a read buffer of its own")
        return False
    cls.__init__, cls.get_buffer = _init_without_buffer, _shared_buffer
    cls.buffer_updated, cls._do_write, cls.resume_writing, cls._write_appdata = (
        _buffer_updated_in_pieces,
        _write_in_pieces,
        _resume_writing_in_pieces,
        _write_appdata_immutable,
    )
    return True


def apply() -> bool:
    """Set the read buffer of this process's TLS connections (one per thread, of 64 KiB), glibc's mmap
    threshold and its arenas (before the process starts threads), and start handing free heap pages back
    every ``TRIM_SECONDS``; whether glibc took them (False where the C library is not glibc: the buffers are
    shared all the same)."""
    sslproto.SSLProtocol.max_size = READ_BUFFER_BYTES
    share_read_buffers()
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt, malloc_trim = (libc.mallopt, libc.malloc_trim) if libc else (None, None)
    except (OSError, AttributeError):
        mallopt = malloc_trim = None
    if mallopt is None or (mallopt(M_MMAP_THRESHOLD, READ_BUFFER_BYTES), mallopt(M_ARENA_MAX, ARENAS)) != (1, 1):
        log.info("glibc's malloc settings not taken (another C library?): buffers are allocated as it does")
        return False
    global trimming
    trimming = trimming or Trimming(malloc_trim, TRIM_SECONDS).start()
    return True


class Trimming:
    """A daemon thread calling glibc's ``malloc_trim(0)`` every ``seconds``: each heap's free pages, wherever
    they are in it, go back to the system (the next allocation there takes a zeroed page again)."""

    def __init__(self, malloc_trim, seconds: float):
        self.malloc_trim, self.seconds = malloc_trim, seconds
        self.passes = 0
        self.passed = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="malloc-trim", daemon=True)

    def _run(self) -> None:
        while True:
            time.sleep(self.seconds)  # a daemon thread: it ends with the process, nothing waits for it
            self.malloc_trim(0)
            with self.passed:
                self.passes += 1
                self.passed.notify_all()

    def start(self) -> Trimming:
        self.thread.start()
        return self

    def wait_passes(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` passes have ended since this call; whether they did within ``timeout``."""
        with self.passed:
            until = self.passes + count
            return self.passed.wait_for(lambda: self.passes >= until, timeout)


trimming: Trimming | None = None  # this process's, once ``apply`` started it
