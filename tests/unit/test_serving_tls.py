"""serving_tls: a TLS server's certificate, key and trusted CAs reloaded when their files change, on both
ways of serving (a context per accepted connection, one listener context switching per handshake)."""

from __future__ import annotations

import logging
import socketserver
import ssl
import threading

import pytest

from gpustack_models.local import pki
from gpustack_models.serving_tls import ServingTLS
from tests.support.secret_volume import (
    Connection,
    Listener,
    answer,
    common_name,
    pair,
    serial,
    served_serial,
    write_volume,
)


def server_context(volume, client_ca=None):
    def build():
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(volume / "tls.crt", volume / "tls.key")
        if client_ca:
            context.load_verify_locations(cafile=client_ca)
            context.verify_mode = ssl.CERT_OPTIONAL
        return context

    return build


class Threaded(socketserver.ThreadingTCPServer):
    """Wraps each accepted connection with ``tls.current()``; answers each line with the client's CN."""

    daemon_threads = True

    def __init__(self, tls: ServingTLS):
        self.tls = tls

        class Handler(socketserver.StreamRequestHandler):
            def setup(handler):
                handler.request = self.tls.current().wrap_socket(handler.request, server_side=True)
                super().setup()

            def handle(handler):
                for _line in handler.rfile:
                    handler.wfile.write(common_name(handler.request.getpeercert()) + b"\n")

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def close(self):
        self.shutdown()
        self.server_close()


@pytest.fixture(params=[Threaded, Listener], ids=["per-connection", "listener"])
def serve(request):
    servers = []

    def start(tls):
        servers.append(request.param(tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def authority(tmp_path):
    ca = pki.new_ca("serving-ca")
    ca.write(tmp_path, "ca")
    return ca


def test_a_swapped_secret_volume_is_served_to_new_handshakes_and_open_connections_keep_working(
    tmp_path, authority, serve, caplog
):
    volume, first, second = tmp_path / "secret", pair(authority), pair(authority)
    write_volume(volume, first)
    tls = ServingTLS("test", str(volume / "tls.crt"), str(volume / "tls.key"), server_context(volume))
    server = serve(tls)
    assert served_serial("127.0.0.1", server.port, tmp_path / "ca.crt") == serial(first)
    before = Connection(server.port, tmp_path / "ca.crt")
    assert before.ask() == b"-"
    with caplog.at_level(logging.INFO, logger="gpustack_models.serving_tls"):
        write_volume(volume, second)  # the ..data symlink swapped: the visible names stay the same links
        assert served_serial("127.0.0.1", server.port, tmp_path / "ca.crt") == serial(second)
    assert before.ask() == b"-", "a connection opened before the swap stopped answering"
    before.close()
    assert tls.reloads == 1
    assert f"serial {serial(second):x}" in caplog.text and "not after" in caplog.text and "CN=server" in caplog.text


def test_a_half_written_pair_keeps_the_previous_certificate_and_logs_one_error(tmp_path, authority, serve, caplog):
    volume, first, second = tmp_path / "secret", pair(authority), pair(authority)
    write_volume(volume, first)
    tls = ServingTLS("test", str(volume / "tls.crt"), str(volume / "tls.key"), server_context(volume))
    server = serve(tls)
    with caplog.at_level(logging.ERROR, logger="gpustack_models.serving_tls"):
        write_volume(volume, {"tls.crt": second["tls.crt"], "tls.key": first["tls.key"]})  # a key of another
        for _ in range(3):
            assert served_serial("127.0.0.1", server.port, tmp_path / "ca.crt") == serial(first)
        write_volume(volume, {"tls.crt": second["tls.crt"][:100], "tls.key": second["tls.key"]})  # truncated
        assert served_serial("127.0.0.1", server.port, tmp_path / "ca.crt") == serial(first)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "gpustack_models.serving_tls"]
    assert len(errors) == 2 and "still serving the previous certificate" in errors[0].getMessage()
    write_volume(volume, second)  # the whole pair: served
    assert served_serial("127.0.0.1", server.port, tmp_path / "ca.crt") == serial(second)


def test_a_rotated_client_ca_is_trusted_by_new_handshakes(tmp_path, authority, serve):
    volume, trust = tmp_path / "secret", tmp_path / "trust"
    old_ca, new_ca = pki.new_ca("client-ca-1"), pki.new_ca("client-ca-2")
    client = pki.issue(new_ca, "new-client", client=True).write(tmp_path, "client")
    write_volume(volume, pair(authority))
    write_volume(trust, {"ca.crt": old_ca.cert_pem})
    build = server_context(volume, str(trust / "ca.crt"))
    server = serve(
        ServingTLS("test", str(volume / "tls.crt"), str(volume / "tls.key"), build, (str(trust / "ca.crt"),))
    )
    assert answer(server.port, tmp_path / "ca.crt", client) is None  # a CA not trusted yet: refused
    write_volume(trust, {"ca.crt": old_ca.cert_pem + new_ca.cert_pem})
    assert answer(server.port, tmp_path / "ca.crt", client) == b"new-client"


def test_a_changed_version_rebuilds_and_a_server_never_starts_without_its_certificate(tmp_path, authority):
    volume = tmp_path / "secret"
    write_volume(volume, pair(authority))
    version = ["1"]
    tls = ServingTLS(
        "test", str(volume / "tls.crt"), str(volume / "tls.key"), server_context(volume), (), lambda: version[0]
    )
    first = tls.current()
    assert tls.current() is first
    version[0] = "2"
    assert tls.current() is not first and tls.reloads == 1
    with pytest.raises(FileNotFoundError):
        ServingTLS("test", str(tmp_path / "none.crt"), str(tmp_path / "none.key"), server_context(tmp_path / "none"))
