"""The metrics port: its routing (GET /metrics only), and its server on loopback: connections that never
finish their request, or too many at once, neither stop it answering scrapes nor hold its threads."""

import gzip
import http.client
import socket
import time

import pytest

from gpustack_models.guarded_http import ConnectionLimits
from gpustack_models.local.ports import free_port
from gpustack_models.telemetry.registry import metrics_app, serve
from tests.plugin.attackers import SlowClient, timed_get
from tests.support.waiting import wait_for


def test_the_metrics_port_answers_get_metrics_only():
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    Counter("unit_total", "a counter", registry=registry).inc()
    app = metrics_app(registry)

    def call(method, path):
        answer = {}
        body = b"".join(
            app({"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": ""}, lambda s, h: answer.update(status=s))
        )
        return answer["status"], body

    status, body = call("GET", "/metrics")
    assert status.startswith("200") and b"unit_total 1.0" in body
    for method, path in (("POST", "/metrics"), ("GET", "/"), ("GET", "/metrics/"), ("DELETE", "/metrics")):
        assert call(method, path)[0].startswith("404"), (method, path)


# --- the metrics port's server -----------------------------------------------------------------------------
SLOW_SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nX-Slow: " + b"a" * 60_000  # never ends its headers


@pytest.fixture
def served():
    """``served(limits)``: ``serve`` of a registry with one counter on a free loopback port, running."""
    servers = []

    def start(limits: ConnectionLimits):
        from prometheus_client import CollectorRegistry, Counter

        registry = CollectorRegistry()
        Counter("unit_total", "a counter", registry=registry).inc()
        servers.append(serve(registry, free_port(), "127.0.0.1", limits))
        return servers[-1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def scrape(port: int, method: str = "GET", path: str = "/metrics", timeout: float = 3.0):
    """``(status, body, seconds)`` of one plain-HTTP request on a new connection (``attackers.timed_get``)."""
    return timed_get("127.0.0.1", port, path, None, timeout=timeout, method=method)


def lateness(server) -> float:
    """How late this machine may be, now, to notice a deadline: 0.2 s plus twice the slowest of three
    ordinary scrapes."""
    rounds = [scrape(server.server_address[1]) for _ in range(3)]
    assert [status for status, _, _ in rounds] == [200] * 3, rounds
    wait_for(lambda: server.open == 0, timeout=5)
    return 0.2 + 2 * max(seconds for _, _, seconds in rounds)


def test_the_metrics_port_answers_over_keep_alive_and_refuses_other_paths(served):
    port = served(ConnectionLimits()).server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for method, path, code in (("GET", "/metrics", 200), ("HEAD", "/metrics", 200), ("GET", "/", 404)):
        conn.request(method, path)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == code, (method, path, resp.status)
        assert (b"unit_total 1.0" in body) == ((method, code) == ("GET", 200)), body
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    resp = conn.getresponse()
    assert resp.getheader("Content-Encoding") == "gzip" and b"unit_total 1.0" in gzip.decompress(resp.read())
    conn.request("POST", "/metrics", body=b"x" * 10)
    resp = conn.getresponse()
    assert resp.status == 404 and resp.getheader("Connection") == "close"  # its body unread: no keep-alive
    conn.close()


def test_a_scrape_trickled_a_byte_at_a_time_is_cut_at_the_deadline_while_others_answer(served):
    limits = ConnectionLimits(request=1.0, idle=1.5, connections=8)
    server = served(limits)
    port = server.server_address[1]
    late = lateness(server)
    slow = SlowClient(("127.0.0.1", port), SLOW_SCRAPE, tls=False, interval=0.1)
    slow.start()
    answers = []
    while slow.is_alive() and len(answers) < 100:
        answers.append(scrape(port))
        time.sleep(0.05)
    slow.join(limits.request + late + 1)
    assert slow.cut_after is not None, "never cut"
    # Cut at the deadline of the whole head, not of each read (it sent a byte every 0.1 s until then).
    assert limits.request <= slow.cut_after <= limits.request + late + 0.1 and slow.sent >= 8, (
        slow.cut_after, slow.sent, late,
    )  # fmt: skip
    assert len(answers) >= 3 and [a for a in answers if a[0] != 200] == [], answers
    wait_for(lambda: server.open == 0, timeout=1)  # no thread held


def test_connections_beyond_the_bound_are_closed_at_once_and_scrapes_answer_once_they_end(served):
    limits = ConnectionLimits(request=2.0, connections=4)
    server = served(limits)
    port = server.server_address[1]
    late = lateness(server)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    wait_for(lambda: server.open == 4, timeout=5)
    started = time.monotonic()
    beyond = [socket.create_connection(("127.0.0.1", port), timeout=1) for _ in range(10)]
    for sock in beyond:
        assert sock.recv(1) == b""  # closed by the accept loop, unread, which went on accepting
    assert time.monotonic() - started <= late, (time.monotonic() - started, late)
    assert scrape(port)[0] != 200 and server.open == 4  # full: a scrape too is closed at once
    held.pop().close()  # one ends: its thread, then its place, is free again
    status, body, _ = wait_for(lambda: (answer := scrape(port))[0] == 200 and answer, timeout=limits.request)
    assert b"unit_total 1.0" in body
    for sock in held + beyond:
        sock.close()
