"""The plugin's HTTPS endpoint: ``/readyz``, ``/livez``, ``/metrics`` and ``GET /model/downloads`` (the
live bytes of running downloads, for the service's token only). Requests are not logged: tokens travel in
headers.

How connections are served (the TLS handshake off the accept loop, deadlines, the bound on open
connections) is ``https_server``'s part: a client that connects and never finishes anything does not
stop the probes' answers."""

from __future__ import annotations

import json

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpustack_models.plugin.https_server import (
    ConnectionLimits,
    GuardedHTTPSServer,
    GuardedRequestHandler,
    server_context,
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
        code = self.plugin.authorized_service(self.headers.get("Authorization"))
        if code != 200:
            return self._send(code, status(code, "Unauthorized" if code == 401 else "Forbidden", DENIED))
        return self._send(200, json.dumps({"downloads": self.plugin.engine.running()}).encode())


def serve(plugin, limits: ConnectionLimits | None = None) -> GuardedHTTPSServer:
    """The HTTPS server of ``plugin`` (not started: call ``serve_forever``): its certificate from the
    plugin's settings, no client certificate asked for."""
    handler = type("Handler", (PluginRequestHandler,), {"plugin": plugin})
    host, _, port = plugin.settings.address.rpartition(":")
    context = server_context(plugin.settings.cert_file, plugin.settings.key_file)
    return GuardedHTTPSServer((host.strip("[]"), int(port)), handler, context, limits or ConnectionLimits())
