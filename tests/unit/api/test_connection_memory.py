"""An API worker's TLS connections (``api.connection_memory``): they read 64 KiB at a time through one buffer per
thread, shared, and every byte arrives intact; a block of 64 KiB that the heap's free top cannot hold gets a
mapping of its own that goes back to the system when freed; the worker's threads share two malloc arenas. Run
in child processes: the settings are the whole process's."""

import subprocess
import sys

# The child scripts' common parts: glibc's malloc counters; a server certificate for 127.0.0.1 and its CA's.
MALLINFO = """
import ctypes


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
"""
SERVER_FILES = """
import ipaddress, tempfile
from pathlib import Path

from gpustack_models.local import pki

ca = pki.new_ca("test-ca")
leaf = pki.issue(ca, "127.0.0.1", ip_addresses=[ipaddress.ip_address("127.0.0.1")], server=True)
where = Path(tempfile.mkdtemp())
crt, key = leaf.write(where, "server")
ca_crt, _ = ca.write(where, "ca")
"""

CHILD = (
    MALLINFO
    + """
import asyncio, ssl, sys, threading
from gpustack_models.api import connection_memory


libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]


def mapped_with(size):
    # glibc serves any request its heap's free top can hold from there, whatever the threshold: take the top
    # first, so the block comes from growing the heap (below the threshold) or from a mapping (at or above).
    filler = libc.malloc(max(libc.mallinfo2().keepcost - 64, 1))
    before = libc.mallinfo2().hblks
    block = bytearray(size)
    during = libc.mallinfo2().hblks
    del block
    after = libc.mallinfo2().hblks
    libc.free(filler)
    return during - before, after - before


def read_buffer():
    loop = asyncio.new_event_loop()
    context = ssl.create_default_context()
    protocol = asyncio.sslproto.SSLProtocol(loop, asyncio.Protocol(), context, None, server_side=False)
    loop.close()
    return len(protocol.get_buffer(-1))  # what the event loop reads a connection's bytes into


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
mapped = mapped_with(64 * 1024)  # before any connection: what a block of that size gets
print(read_buffer(), *mapped, flush=True)
threads_allocating()
"""
)


def child(*args) -> tuple[list[str], int]:
    done = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=True)
    return done.stdout.split(), done.stderr.count("Arena ")


def test_a_connection_reads_64_kib_at_a_time_a_block_that_large_is_mapped_and_threads_share_two_arenas():
    # Without: Python's 256 KiB read buffer per connection; a 64 KiB block from the heap (below glibc's
    # default threshold of 128 KiB); eight threads allocating at once, each in an arena of its own.
    out, arenas = child("as-is")
    assert out == ["262144", "0", "0"] and arenas > 2, (out, arenas)
    # With: reads of 64 KiB; a block of 64 KiB gets a mapping of its own, unmapped when freed; two arenas.
    out, arenas = child("apply")
    assert out == ["True", "65536", "1", "0"] and arenas == 2, (out, arenas)


SHARED = (
    """
import asyncio, hashlib, os, ssl, sys, threading

from gpustack_models.api import connection_memory

connection_memory.apply()
"""
    + SERVER_FILES
    + """
SIZES = (1, 700, 16 * 1024 + 1, 65536, 65537, 300 * 1024, 3 * 1024 * 1024)


async def exchange(server_side):
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(crt, key)

    async def serve(reader, writer):  # each message: 8-byte length, the bytes; answered with their sha256
        server_side.append(writer.transport._ssl_protocol)
        while True:
            try:
                header = await reader.readexactly(8)
            except asyncio.IncompleteReadError:
                break
            body = await reader.readexactly(int.from_bytes(header, "big"))
            writer.write(hashlib.sha256(body).digest())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=served)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(ca_crt))

    async def one(seed):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        wrong = 0
        for i, size in enumerate(SIZES[seed % 3:] + SIZES[: seed % 3]):
            body = os.urandom(size)
            writer.write(size.to_bytes(8, "big"))
            for at in range(0, size, 100_000):  # in pieces, so the connections' reads interleave
                writer.write(body[at:at + 100_000])
                await writer.drain()
            wrong += await reader.readexactly(32) != hashlib.sha256(body).digest()
        writer.close()
        return wrong

    wrong = sum(await asyncio.gather(*(one(seed) for seed in range(12))))
    server.close()
    await server.wait_closed()
    return wrong


def in_thread(results):
    protocols = []
    results.append((asyncio.run(exchange(protocols)), protocols))


results = []
threads = [threading.Thread(target=in_thread, args=(results,)) for _ in range(2)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for wrong, protocols in results:
    buffers = {id(p._ssl_buffer_view.obj) for p in protocols}
    print(wrong, len(protocols), len(buffers), all(p._ssl_buffer is None for p in protocols))
print(len({id(p._ssl_buffer_view.obj) for _, protocols in results for p in protocols}))
"""
)


def test_the_tls_connections_of_a_thread_read_through_one_buffer_and_every_byte_arrives_intact():
    # Two threads, each with an event loop serving 12 TLS connections that send messages of 1 B to 3 MiB at
    # once, in pieces: every message's sha256 comes back right; the 12 server-side connections of a thread
    # share one read buffer and hold none of their own; the two threads' buffers differ.
    done = subprocess.run([sys.executable, "-c", SHARED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert lines[:2] == ["0 12 1 True", "0 12 1 True"] and lines[2] == "2", done.stdout


SLOW_READER = (
    MALLINFO
    + """
import asyncio, hashlib, os, socket, ssl, sys

from gpustack_models.api import connection_memory

if sys.argv[1] == "apply":
    connection_memory.apply()
"""
    + SERVER_FILES
    + """
CONNECTIONS, SMALL_SOCKET = 8, 16 * 1024
PIECES = (1, 700, 65536, 300 * 1024, 3 * 1024 * 1024)  # an answer written in pieces; 300 KiB as a bytearray


def in_use():
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


async def main():
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(crt, key)
    backed_up, peaks = [], []

    async def serve(reader, writer):
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_SOCKET)
        backed_up.append(asyncio.Event())
        mine, peak = backed_up[-1], 0
        while await reader.readexactly(1) == b"go":
            pass
        while (command := await reader.readexactly(1)) != b"q":
            for size in PIECES:
                piece = bytearray(os.urandom(size)) if size == 300 * 1024 else os.urandom(size)
                writer.write(piece)
                writer.write(hashlib.sha256(piece).digest())
                if isinstance(piece, bytearray):
                    piece[:] = bytes(size)  # changed once written: what was written must still be sent
                peak = max(peak, writer.transport.get_write_buffer_size())
                if peak >= 256 * 1024:
                    mine.set()  # the client does not read yet: bytes wait for the socket
                await writer.drain()
            piece = None  # the answer is the server's no more
            if command == b"c":  # and close at once, while the socket may still be full
                writer.close()
                break
        peaks.append(peak)

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=served)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(ca_crt))

    async def connect():
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_SOCKET)
        sock.connect(("127.0.0.1", port))
        return await asyncio.open_connection(sock=sock, ssl=client, server_hostname="127.0.0.1")

    connections = [await connect() for _ in range(CONNECTIONS)]
    for _, writer in connections:
        writer.write(b"\\x01")  # the first exchange: handshakes done, a record each way
    while len(backed_up) < CONNECTIONS:
        await asyncio.sleep(0.01)
    before = in_use()

    async def one(index, reader, writer, command):
        writer.write(command)
        await backed_up[index].wait()  # only once the server is held back by this reader
        wrong = 0
        for size in PIECES:
            body = await reader.readexactly(size)
            wrong += await reader.readexactly(32) != hashlib.sha256(body).digest()
        if command == b"c":
            wrong += await reader.read() != b""  # all of it before the close
        return wrong

    # Half the connections stay open after their answer; the other half are closed by the server right after
    # it, with the answer still waiting for the socket.
    wrong = sum(await asyncio.gather(*(one(i, r, w, b"a" if i % 2 else b"c") for i, (r, w) in enumerate(connections))))
    open_ones = [(r, w) for i, (r, w) in enumerate(connections) if i % 2]
    await asyncio.sleep(0.2)
    held = (in_use() - before) // len(open_ones) // 1024
    for _, writer in open_ones:
        writer.write(b"q")
    while len(peaks) < CONNECTIONS:
        await asyncio.sleep(0.01)
    print(wrong, min(peaks) >= 256 * 1024, held)
    os._exit(0)


asyncio.run(main())
"""
)


def slow_reader(mode: str) -> tuple[int, bool, int]:
    done = subprocess.run([sys.executable, "-c", SLOW_READER, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    wrong, backed_up, held = done.stdout.split()
    return int(wrong), backed_up == "True", int(held)


def test_a_connection_that_once_met_a_slow_reader_does_not_keep_the_memory_of_that_moment():
    # Eight TLS connections, each with small socket buffers, whose server writes 3.4 MiB in pieces (one a
    # bytearray changed once written) while the client does not read yet, then reads: every byte arrives,
    # also on the four connections the server closes right after writing. Then, per connection still open,
    # what the process holds more than before the answers: asyncio as shipped keeps about 3 MiB (its memory
    # BIOs, grown to the most they held: the biggest piece written, encrypted at once); with apply about 80 KiB.
    wrong, backed_up, held = slow_reader("as-is")
    assert (wrong, backed_up) == (0, True) and held > 1024, held
    wrong, backed_up, held = slow_reader("apply")
    assert (wrong, backed_up) == (0, True) and held < 192, held


HEAP_HOLES = """
import sys

from gpustack_models.api import connection_memory


def resident_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


if sys.argv[1] == "apply":
    connection_memory.TRIM_SECONDS = 0.05
    connection_memory.apply()
before = resident_mb()
# 40 MiB of blocks below the mmap threshold (from the heap), written, then all freed but the last: it stays
# above them, so the heap's top cannot shrink past them and glibc's free keeps their pages.
blocks = [b"\\x01" * (32 * 1024) for _ in range(1280)]
pinned = blocks.pop()
del blocks
if sys.argv[1] == "apply":
    assert connection_memory.trimming.wait_passes(2, timeout=30), "no trimming pass"
print(round(resident_mb() - before, 1), len(pinned))
"""


def heap_holes(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", HEAP_HOLES, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    held, pinned = done.stdout.split()
    assert pinned == str(32 * 1024)
    return float(held)


def test_pages_freed_inside_the_heap_go_back_to_the_system():
    # 40 MiB freed below a block still in use: glibc as shipped keeps them resident (an API worker's memory
    # then follows the most its heap was ever spread over); with apply, a pass of the trimming thread gives
    # them back.
    assert heap_holes("as-is") > 30
    assert heap_holes("apply") < 4
