"""The plugin's HTTPS endpoint on a real TLS server on loopback: what it answers, and that connections
which never finish anything (idle, half a TLS handshake, a request a byte at a time) neither stop it
from answering nor hold its threads forever."""

from __future__ import annotations

import datetime
import http.client
import json
import logging
import select
import socket
import ssl
import threading
import time
from types import SimpleNamespace

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpustack_models.local import pki
from gpustack_models.plugin.engine import Engine, Metrics
from gpustack_models.plugin.https_server import PLUGIN_SUBJECT_PREFIX, SERVICE_SUBJECT, ConnectionLimits
from gpustack_models.plugin.node.endpoints import serve
from tests.plugin.attackers import SLOW_REQUEST, Attack, SlowClient, client_context, client_hello, probe, timed_get
from tests.plugin.conftest import settings, wait_for


class FakePlugin:
    """What ``serve`` reads of the plugin: its settings, metrics and engine; and the client certificates of
    the plugin CA that callers may hold (``clients``: name -> (cert, key) files)."""

    def __init__(self, tmp_path):
        ca = pki.new_ca("plugin-ca")
        directory = tmp_path / "pki"
        cert_file, key_file = pki.issue(ca, "node-a", ip_addresses=("127.0.0.1",), server=True).write(
            directory, "plugin"
        )
        self.ca_file, _ = ca.write(directory, "ca")
        self.settings = SimpleNamespace(
            address="127.0.0.1:0", cert_file=str(cert_file), key_file=str(key_file), plugin_ca_file=str(self.ca_file)
        )
        self.metrics = Metrics()
        self.engine = Engine(tmp_path / "cache", settings=settings(), metrics=self.metrics)
        other_ca = pki.new_ca("plugin-ca")  # the same name, another key
        self.clients = {
            "service": pki.issue(ca, SERVICE_SUBJECT, client=True).write(directory, "service"),
            "node-b": pki.issue(ca, f"{PLUGIN_SUBJECT_PREFIX}node-b", client=True).write(directory, "node-b"),
            "serving": (cert_file, key_file),  # serverAuth only
            "other-ca": pki.issue(other_ca, SERVICE_SUBJECT, client=True).write(directory, "other-ca"),
            "no-usage": without_usage(ca, SERVICE_SUBJECT).write(directory, "no-usage"),
        }

    def context(self, client: str | None = None) -> ssl.SSLContext:
        context = client_context(self.ca_file)
        if client is not None:
            context.load_cert_chain(*self.clients[client])
        return context


def without_usage(ca: pki.KeyPair, name: str) -> pki.KeyPair:
    """A certificate of ``ca`` for ``name`` with no ExtendedKeyUsage at all."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca.key, hashes.SHA256())
    )
    return pki.KeyPair(cert, key)


@pytest.fixture
def plugin(tmp_path):
    plugin = FakePlugin(tmp_path)
    yield plugin
    plugin.engine.close(timeout=10)


def running(server):
    threading.Thread(target=server.serve_forever, daemon=True, name="https").start()


@pytest.fixture
def served(plugin):
    """``served(**kwargs)``: ``serve(plugin, **kwargs)``, running."""
    servers = []

    def start(**kwargs):
        servers.append(serve(plugin, **kwargs))
        running(servers[-1])
        return servers[-1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_it_keeps_answering_health_under_idle_half_tls_and_byte_at_a_time_connections(plugin, served):
    server = served()
    port = server.server_address[1]
    context = client_context(plugin.ca_file)
    with Attack("127.0.0.1", port, idle=50, hellos=5) as attack:
        answers = probe("127.0.0.1", port, ["/livez", "/readyz"], context, rounds=10)
        assert [a for a in answers if a[1] != 200 or a[2] >= 1.0] == [], (answers, attack.not_connected)
        assert len(answers) == 20
        held, open_ = attack.held(), server.open
        slow = [attack.slow_hello, attack.slow_request]
    # The attack was in force all along: the server held every connection and the slow clients kept sending.
    assert attack.not_connected == 0 and held == 55 and open_ == 57
    assert [(c.cut_after, c.error) for c in slow] == [(None, None)] * 2 and min(c.sent for c in slow) >= 10


def get(conn: http.client.HTTPSConnection, path: str, **headers):
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.getheader("Content-Type"), resp.read()


def test_it_answers_each_endpoint_over_tls_with_the_settings_certificate_and_keep_alive(plugin, served):
    port = served().server_address[1]
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=plugin.context(), timeout=5)
    assert get(conn, "/livez") == (200, "text/plain", b"ok")
    assert get(conn, "/readyz?verbose") == (200, "text/plain", b"ok")
    status, kind, body = get(conn, "/metrics")
    assert status == 200 and kind.startswith("text/plain; version=") and b"gpustack_models_plugin_models" in body
    status, _, body = get(conn, "/model/downloads")
    assert status == 401 and json.loads(body)["reason"] == "Unauthorized"
    status, _, body = get(conn, "/model/downloads", Authorization="Bearer a-token-of-anyone")  # no credential
    assert status == 401 and json.loads(body)["reason"] == "Unauthorized"
    status, _, body = get(conn, "/nowhere")
    assert status == 404 and json.loads(body)["reason"] == "NotFound"
    # All of it on one connection, with no client certificate, and the settings' certificate served.
    served_cert = ssl.DER_cert_to_PEM_cert(conn.sock.getpeercert(binary_form=True))
    assert served_cert.strip() == open(plugin.settings.cert_file).read().strip()
    conn.close()


def downloads(port: int, context: ssl.SSLContext):
    """(status, body) of ``GET /model/downloads`` on a connection of its own; ``None`` when the handshake
    (or the first read after it: TLS 1.3 tells a refused client certificate then) fails."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    try:
        status, _, body = get(conn, "/model/downloads")
    except (ssl.SSLError, ConnectionError):
        return None
    finally:
        conn.close()
    return status, body


def test_live_bytes_are_for_the_services_client_certificate_alone(plugin, served):
    port = served().server_address[1]
    assert downloads(port, plugin.context("service")) == (200, b'{"downloads": []}')
    status, body = downloads(port, plugin.context("node-b"))  # a node's plugin: the CA's, but not the service
    assert status == 403 and json.loads(body)["reason"] == "Forbidden"
    assert downloads(port, plugin.context("serving")) is None  # the CA's, for serving only: no handshake
    assert downloads(port, plugin.context("other-ca")) is None  # the service's name, from another CA
    # One the handshake takes (no ExtendedKeyUsage: any purpose, for TLS) is still no client's to the plugin.
    status, body = downloads(port, plugin.context("no-usage"))
    assert status == 401 and json.loads(body)["reason"] == "Unauthorized"


class Closes(threading.Thread):
    """Notes, from a thread of its own, when the server closes each of ``socks`` (what it sends before is
    read and dropped): ``at``, monotonic seconds each, ``None`` while open."""

    def __init__(self, socks):
        super().__init__(daemon=True, name="closes")
        self.socks = list(socks)
        self.at: list[float | None] = [None] * len(self.socks)
        for sock in self.socks:
            sock.setblocking(False)
        self.start()

    def run(self):
        while None in self.at:
            waiting = [s for s, at in zip(self.socks, self.at) if at is None]
            try:
                ready = select.select(waiting, [], [], 0.1)[0]
            except (OSError, ValueError):  # a socket closed by the test: nothing more to note
                return
            now = time.monotonic()
            for sock in ready:
                if _ended(sock):
                    self.at[self.socks.index(sock)] = now

    def wait(self, timeout: float) -> list[float]:
        """The times, once every socket was closed; fails if one is still open after ``timeout`` seconds."""
        self.join(timeout)
        assert None not in self.at, f"still open after {timeout:.2f} s: {self.at}"
        return list(self.at)


def _ended(sock) -> bool:
    try:
        while sock.recv(65536):
            pass
        return True
    except (BlockingIOError, ssl.SSLWantReadError):
        return False
    except OSError:
        return True


def lateness(server, context) -> float:
    """How late this machine may be, now, to notice a deadline: 0.2 s plus twice the slowest of three
    ordinary round trips to ``server`` (a connection, its TLS handshake, a request and its answer)."""
    rounds = [timed_get("127.0.0.1", server.server_address[1], "/livez", context) for _ in range(3)]
    assert [status for status, _, _ in rounds] == [200] * 3, rounds
    wait_for(lambda: server.open == 0, timeout=5)  # their connections' threads are done
    return 0.2 + 2 * max(seconds for _, _, seconds in rounds)


def test_it_closes_each_connection_at_its_deadline_however_slowly_it_sends(plugin, served):
    limits = ConnectionLimits(handshake=0.5, request=1.0, idle=1.5)
    server = served(limits=limits)
    address, context = ("127.0.0.1", server.server_address[1]), client_context(plugin.ca_file)
    late = lateness(server, context)
    connected = time.monotonic()
    idle, hello = socket.create_connection(address), socket.create_connection(address)
    hello.sendall(client_hello())
    closes = Closes([idle, hello])
    slow_hello = SlowClient(address, client_hello(), tls=False, interval=0.1)
    slow_request = SlowClient(address, SLOW_REQUEST, tls=True, interval=0.1)
    slow_hello.start(), slow_request.start()
    # Beside them, keep-alive: each request gets its own deadline (three requests span more than one),
    # then idle is closed.
    conn = http.client.HTTPSConnection(*address, context=context, timeout=5)
    first = time.monotonic()
    for i in range(3):
        if i:
            time.sleep(0.6)  # a pause between requests, well within the idle deadline
        last = time.monotonic()
        assert get(conn, "/livez")[0] == 200
    assert last - first > limits.request
    kept = Closes([conn.sock])
    # Closed at the handshake's deadline (from the accept): never before it, and no later than this
    # machine is late now.
    for at in closes.wait(limits.handshake + late):
        assert limits.handshake <= at - connected <= limits.handshake + late, (at - connected, late)
    slow_hello.join(limits.request + late + 1), slow_request.join(limits.request + late + 1)
    assert slow_hello.cut_after is not None and slow_request.cut_after is not None, "never cut"
    # Each was sending a byte every 0.1 s when cut (and notices the cut at its next byte): the deadline is
    # for the whole handshake, the whole head (the first request's counting from the handshake).
    hello_cut, request_cut = slow_hello.cut_after, slow_request.cut_after
    assert limits.handshake <= hello_cut <= limits.handshake + late + 0.1 and slow_hello.sent >= 3, (
        hello_cut, slow_hello.sent, late,
    )  # fmt: skip
    assert limits.request <= request_cut <= limits.request + late + 0.1 and slow_request.sent >= 8, (
        request_cut, slow_request.sent, late,
    )  # fmt: skip
    [at] = kept.wait(limits.idle + late)
    assert limits.idle <= at - last <= limits.idle + late, (at - last, late)
    wait_for(lambda: server.open == 0, timeout=1)  # no thread held


def test_it_closes_connections_beyond_the_bound_at_once_and_serves_again_when_they_end(plugin, served, caplog):
    limits = ConnectionLimits(handshake=1.0, connections=4)
    server = served(limits=limits)
    port = server.server_address[1]
    late = lateness(server, client_context(plugin.ca_file))
    connected = time.monotonic()
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    wait_for(lambda: server.open == 4, timeout=5)
    closes = Closes(held)  # noted as they happen, beside what follows
    with caplog.at_level(logging.WARNING, logger="gpustack_models.plugin.https_server"):
        started = time.monotonic()
        beyond = [socket.create_connection(("127.0.0.1", port), timeout=1) for _ in range(10)]
        for sock in beyond:
            assert sock.recv(1) == b""  # closed by the accept loop, which went on accepting
        refused = time.monotonic()
    # At once: all ten in less time than this machine now takes for an ordinary round trip or two.
    assert refused - started <= late, (refused - started, late)
    assert [r.getMessage() for r in caplog.records if r.name == "gpustack_models.plugin.https_server"] == [
        "4 connections open, the most allowed: closing new ones (from 127.0.0.1, ...)"
    ]
    assert server.open == 4
    # The held ones are closed at their handshake's deadline, never before it and no later than this
    # machine is late now; the ones beyond the bound were all closed before that: at once, not at a
    # deadline of their own (which would come after the held ones', as they connected after them).
    ends = closes.wait(limits.handshake + late)
    assert all(limits.handshake <= at - connected <= limits.handshake + late for at in ends), (
        [at - connected for at in ends], late,
    )  # fmt: skip
    assert refused < min(ends), (refused - connected, [at - connected for at in ends])
    wait_for(lambda: server.open == 0, timeout=1)
    answers = probe("127.0.0.1", port, ["/livez"], client_context(plugin.ca_file), rounds=5, pause=0)
    assert [a[1] for a in answers] == [200] * 5
