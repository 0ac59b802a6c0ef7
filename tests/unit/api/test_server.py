"""The API's idle keep-alive connections while it stops (``gpustack_models.api.server``): one that turns idle
after SIGTERM (its answer went out before the signal, the call behind it ended after) is closed, not kept for
its next request: kept, it held the stop until gunicorn's graceful timeout (a stop took 5.2 s)."""

from types import SimpleNamespace

import pytest

from gpustack_models.api import server
from gpustack_models.api.server import TLSASGIProtocol


class Connection(TLSASGIProtocol):
    """A connection with only what ``_arm_keepalive_timer`` reads of it (gunicorn's own set-up skipped) and a
    record of its closing."""

    def __init__(self, alive: bool):
        self.worker = SimpleNamespace(alive=alive)
        self.closed = 0

    def _keepalive_timeout(self):
        self.closed += 1


@pytest.fixture
def armed(monkeypatch):
    """The connections gunicorn's own ``_arm_keepalive_timer`` set waiting for their next request."""
    armed = []

    def arm(self):
        armed.append(self)

    monkeypatch.setattr(server.ASGIProtocol, "_arm_keepalive_timer", arm)
    yield armed
    for conn in armed:
        server._idle.discard(conn)


def test_a_connection_turning_idle_while_the_worker_stops_is_closed_at_once(armed):
    conn = Connection(alive=False)
    TLSASGIProtocol._arm_keepalive_timer(conn)
    assert (armed, conn.closed) == ([], 1) and conn not in server._idle


def test_a_connection_turning_idle_while_the_worker_serves_waits_for_its_next_request(armed):
    conn = Connection(alive=True)
    TLSASGIProtocol._arm_keepalive_timer(conn)
    assert (armed, conn.closed) == ([conn], 0) and conn in server._idle
