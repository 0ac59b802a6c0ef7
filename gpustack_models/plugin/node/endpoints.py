"""The plugin's HTTPS endpoint: ``/readyz``, ``/livez``, ``/metrics`` and ``GET /model/downloads`` (the
live bytes of running downloads, for the service's client certificate only: subject
``system:gpustack-models-service``, of the plugin CA, ``clientAuth``). The port asks for a client
certificate and does not require one (the probes and scrapers come without); one that does not verify
against the plugin CA ends the handshake. No header is taken as a credential; requests are not logged.

How connections are served (the TLS handshake off the accept loop, deadlines, the bound on open
connections) is ``https_server``'s part: a client that connects and never finishes anything does not
stop the probes' answers."""

from __future__ import annotations

import json

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpustack_models.plugin.https_server import (
    SERVICE_SUBJECT,
    ConnectionLimits,
    GuardedHTTPSServer,
    GuardedRequestHandler,
    client_name,
    serving_tls,
    status,
)

DENIED = "only the gpustack-models service reads live downloads"


class PluginRequestHandler(GuardedRequestHandler):
    plugin = None  # set on the subclass ``serve`` makes

    def log_message(self, fmt, *args):
        pass

    def _send(self, code: int, body: bytes, content_type="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?")[0]
        if path in ("/readyz", "/livez"):
            return self._send(200, b"ok", "text/plain")
        if path == "/metrics":
            return self._send(200, generate_latest(self.plugin.metrics.registry), CONTENT_TYPE_LATEST)
        if path == "/model/downloads":
            return self.downloads()
        return self._send(404, status(404, "NotFound"))

    def downloads(self):
        code = authorized_service(client_name(self.connection))
        if code != 200:
            return self._send(code, status(code, "Unauthorized" if code == 401 else "Forbidden", DENIED))
        return self._send(200, json.dumps({"downloads": self.plugin.engine.running()}).encode())


def authorized_service(name: str | None) -> int:
    """200 for the service's client certificate, 401 without a client certificate (or with one that may not
    authenticate a client), 403 for anyone else's (a node's plugin)."""
    if name is None:
        return 401
    return 200 if name == SERVICE_SUBJECT else 403


def serve(plugin, limits: ConnectionLimits | None = None) -> GuardedHTTPSServer:
    """The HTTPS server of ``plugin`` (not started: call ``serve_forever``): its certificate from the
    plugin's settings, a client certificate of the plugin CA asked for, not required."""
    handler = type("Handler", (PluginRequestHandler,), {"plugin": plugin})
    host, _, port = plugin.settings.address.rpartition(":")
    settings = plugin.settings
    tls = serving_tls("plugin HTTPS port", settings.cert_file, settings.key_file, settings.plugin_ca_file)
    address = (host.strip("[]"), int(port))
    return GuardedHTTPSServer(address, handler, tls, limits or ConnectionLimits())
