"""The plugin's HTTPS server: its certificate and client CA files reloaded for new connections, a keep-alive
connection of before a swap still answering after it."""

from __future__ import annotations

import http.client
import ssl
import threading
from types import SimpleNamespace

import pytest

from gpustack_models.local import pki
from gpustack_models.plugin.https_server import (
    SERVICE_SUBJECT,
    ConnectionLimits,
    GuardedHTTPSServer,
    GuardedRequestHandler,
    client_name,
    serving_tls,
)
from tests.support.secret_volume import pair, serial, served_serial, write_volume


class WhoHandler(GuardedRequestHandler):
    def do_GET(self):
        body = (client_name(self.connection) or "-").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def plugin(tmp_path):
    """A server as the plugin's peer port runs it: its certificate and its peers' CA in volumes."""
    authority = pki.new_ca("plugin-ca")
    authority.write(tmp_path, "ca")
    first = pair(authority)
    write_volume(tmp_path / "tls", first)
    write_volume(tmp_path / "trust", {"ca.crt": authority.cert_pem})
    tls = serving_tls(
        "peer port", str(tmp_path / "tls/tls.crt"), str(tmp_path / "tls/tls.key"), str(tmp_path / "trust/ca.crt"), True
    )
    server = GuardedHTTPSServer(("127.0.0.1", 0), WhoHandler, tls, ConnectionLimits())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = pki.issue(authority, SERVICE_SUBJECT, client=True).write(tmp_path, "client")
    yield SimpleNamespace(tmp=tmp_path, authority=authority, first=first, server=server, client=client)
    server.shutdown()
    server.server_close()


def connection(plugin, client) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(plugin.tmp / "ca.crt"))
    context.check_hostname = False
    context.load_cert_chain(*(str(path) for path in client))
    return http.client.HTTPSConnection("127.0.0.1", plugin.server.server_address[1], context=context, timeout=5)


def who(conn: http.client.HTTPSConnection) -> bytes | None:
    try:
        conn.request("GET", "/who")
        response = conn.getresponse()
        return response.read() if response.status == 200 else None
    except (ssl.SSLError, ConnectionError):
        return None


def test_a_renewed_certificate_is_served_to_new_connections_and_a_keep_alive_one_keeps_answering(plugin):
    kept = connection(plugin, plugin.client)
    assert who(kept) == SERVICE_SUBJECT.encode()
    renewed = pair(plugin.authority)
    write_volume(plugin.tmp / "tls", renewed)
    port = plugin.server.server_address[1]
    assert served_serial("127.0.0.1", port, plugin.tmp / "ca.crt", plugin.client) == serial(renewed)
    assert who(kept) == SERVICE_SUBJECT.encode(), "the connection opened before the renewal stopped answering"
    kept.close()


def test_a_peer_ca_added_to_the_trusted_file_admits_its_clients_on_new_connections(plugin):
    rotated = pki.new_ca("plugin-ca-2")
    newcomer = pki.issue(rotated, SERVICE_SUBJECT, client=True).write(plugin.tmp, "newcomer")
    kept = connection(plugin, plugin.client)
    assert who(kept) == SERVICE_SUBJECT.encode()
    assert who(connection(plugin, newcomer)) is None  # not trusted yet: no handshake
    write_volume(plugin.tmp / "trust", {"ca.crt": plugin.authority.cert_pem + rotated.cert_pem})
    assert who(connection(plugin, newcomer)) == SERVICE_SUBJECT.encode()
    assert who(kept) == SERVICE_SUBJECT.encode()
    write_volume(plugin.tmp / "trust", {"ca.crt": b"-----BEGIN CERTIFICATE-----\nMIIB"})  # half-written
    assert who(connection(plugin, newcomer)) == SERVICE_SUBJECT.encode()  # the previous trust still serves
