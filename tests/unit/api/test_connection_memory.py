"""An API worker's TLS connections: a 64 KiB read buffer each, in a mapping of its own that goes back to the
system when the connection closes; its threads share two malloc arenas (``api.connection_memory``). Run in a
child process: the settings are the whole process's."""

import subprocess
import sys

CHILD = """
import asyncio, ctypes, ssl, sys, threading
from gpustack_models.api import connection_memory


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2


def mapped_with(size):
    before = libc.mallinfo2().hblks
    block = bytearray(size)
    during = libc.mallinfo2().hblks
    del block
    return during - before, libc.mallinfo2().hblks - before


def read_buffer():
    loop = asyncio.new_event_loop()
    context = ssl.create_default_context()
    protocol = asyncio.sslproto.SSLProtocol(loop, asyncio.Protocol(), context, None, server_side=False)
    loop.close()
    return len(protocol._ssl_buffer)


def threads_allocating(count=8):
    held, ready, done = [], threading.Barrier(count + 1), threading.Event()

    def allocate():
        held.append(ctypes.create_string_buffer(4096))  # malloc, from this thread's arena
        ready.wait()
        done.wait()

    threads = [threading.Thread(target=allocate) for _ in range(count)]
    for thread in threads:
        thread.start()
    ready.wait()
    libc.malloc_stats()  # one "Arena N:" block per arena, on stderr
    done.set()
    for thread in threads:
        thread.join()


if sys.argv[1] == "apply":
    print(connection_memory.apply())
print(read_buffer(), *mapped_with(64 * 1024), flush=True)
threads_allocating()
"""


def child(*args) -> tuple[list[str], int]:
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=True)
    return done.stdout.split(), done.stderr.count("Arena ")


def test_a_connection_reads_into_64_kib_held_in_a_mapping_of_its_own_and_threads_share_two_arenas():
    # Without: Python's 256 KiB read buffer per connection; a 64 KiB block from the heap (below glibc's
    # default threshold of 128 KiB); eight threads allocating at once, each in an arena of its own.
    out, arenas = child("as-is")
    assert out == ["262144", "0", "0"] and arenas > 2, (out, arenas)
    # With: 64 KiB per connection; a block of 64 KiB gets a mapping of its own, unmapped when freed; two arenas.
    out, arenas = child("apply")
    assert out == ["True", "65536", "1", "0"] and arenas == 2, (out, arenas)
