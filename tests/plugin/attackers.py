"""Clients that hold a TLS server's connections without ever finishing anything, and a probe that times
one request: the attack the plugin's HTTPS endpoint must survive (``test_endpoints.py`` against
``serve``, ``tests/test_plugins.py`` against a running plugin)."""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import time

SLOW_REQUEST = b"GET /livez HTTP/1.1\r\nHost: plugin\r\nX-Slow: " + b"a" * 60_000  # never ends its headers


def client_context(ca_file=None) -> ssl.SSLContext:
    """Checks the server against ``ca_file``; without one, checks nothing (as an attacker would)."""
    if ca_file:
        return ssl.create_default_context(cafile=str(ca_file))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def client_hello() -> bytes:
    """The first flight of a real TLS client: a whole ClientHello."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context().wrap_bio(incoming, outgoing, server_side=False)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (whatever it sent before is read and dropped)."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def gave_up(sock: socket.socket) -> bool:
    """Whether the server answered or closed ``sock``: TLS records that carry no data (session
    tickets) are neither."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    sock.setblocking(False)
    try:
        sock.recv(65536)
        return True  # an answer, or the end of the connection
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(5)


class SlowClient(threading.Thread):
    """Sends ``data`` one byte every ``interval`` seconds (after a TLS handshake when ``tls``), and
    notes when the server gives up on it: ``cut_after``, seconds since it connected."""

    def __init__(self, address, data: bytes, *, tls: bool, interval: float):
        super().__init__(daemon=True, name="slow-client")
        self.address, self.data, self.tls, self.interval = address, data, tls, interval
        self.stopping = threading.Event()
        self.sent = 0
        self.cut_after: float | None = None
        self.error: Exception | None = None
        self.sock = None

    def run(self):
        started = time.monotonic()
        try:
            self.sock = socket.create_connection(self.address, timeout=5)
            if self.tls:
                self.sock = client_context().wrap_socket(self.sock)
            for byte in self.data:
                if self.stopping.wait(self.interval):
                    return
                if gave_up(self.sock):
                    break
                self.sock.sendall(bytes([byte]))
                self.sent += 1
        except OSError as exc:
            self.error = exc
        self.cut_after = time.monotonic() - started

    def stop(self):
        self.stopping.set()
        if self.sock is not None:
            self.sock.close()


class Attack:
    """``idle`` TCP connections that never send a byte, ``hellos`` that send a ClientHello and never
    finish the handshake, one ClientHello sent a byte at a time, and one request sent a byte at a time
    over TLS. Connections the server does not take within a second are given up (and counted)."""

    def __init__(self, host: str, port: int, *, idle: int = 50, hellos: int = 5, interval: float = 0.1):
        self.address = (host, port)
        self.idle_count, self.hello_count, self.interval = idle, hellos, interval
        self.idle: list[socket.socket] = []
        self.hellos: list[socket.socket] = []
        self.not_connected = 0
        self.slow_hello: SlowClient | None = None
        self.slow_request: SlowClient | None = None

    def __enter__(self) -> Attack:
        hello = client_hello()
        self.idle = self._open(self.idle_count)
        self.hellos = self._open(self.hello_count)
        for sock in self.hellos:
            sock.sendall(hello)
        self.slow_hello = SlowClient(self.address, hello, tls=False, interval=self.interval)
        self.slow_request = SlowClient(self.address, SLOW_REQUEST, tls=True, interval=self.interval)
        self.slow_hello.start()
        self.slow_request.start()
        return self

    def __exit__(self, *exc):
        for client in (self.slow_hello, self.slow_request):
            client.stop()
        for sock in self.idle + self.hellos:
            sock.close()

    def _open(self, count: int) -> list[socket.socket]:
        out = []
        for _ in range(count):
            try:
                out.append(socket.create_connection(self.address, timeout=1))
            except OSError:
                self.not_connected += 1
        return out

    def held(self) -> int:
        """How many of the idle and ClientHello connections the server still holds open."""
        return sum(not closed_by_server(sock) for sock in self.idle + self.hellos)


def timed_get(
    host: str, port: int, path: str, context: ssl.SSLContext | None, timeout: float = 3.0, method: str = "GET"
):
    """``(status, body, seconds)`` of one request (GET by default) on a new connection, over TLS with
    ``context`` (the handshake included) or plain HTTP without; the exception's text instead of the status
    when it fails."""
    started = time.monotonic()
    if context is None:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read(), time.monotonic() - started
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}", b"", time.monotonic() - started
    finally:
        conn.close()


def probe(host: str, port: int, paths, context: ssl.SSLContext, rounds: int = 10, pause: float = 0.1):
    """Each of ``paths`` ``rounds`` times, each on a new connection: ``[(path, status, seconds)]``.
    Stops at the first failure (the server is not answering: no point waiting out the rest)."""
    out = []
    for _ in range(rounds):
        for path in paths:
            status, body, seconds = timed_get(host, port, path, context)
            out.append((path, status, round(seconds, 3)))
            if status != 200 or body != b"ok":
                return out
        time.sleep(pause)
    return out
