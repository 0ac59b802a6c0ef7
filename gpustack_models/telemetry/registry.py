"""Prometheus metrics of the service's roles: one registry to scrape per process, prometheus_client's
multiprocess mode for the roles that fork worker processes, and the plain metrics port of the roles without an
HTTP server of their own.

- The API (gunicorn, several worker processes) and the Celery worker (a prefork pool) run in
  prometheus_client's multiprocess mode: ``use_multiprocess(role)`` makes a directory of its own for this
  start (``<temp dir>/gpustack-models-metrics/<role>-<pid>``, emptied; those of earlier starts whose
  process is gone are removed), points ``PROMETHEUS_MULTIPROC_DIR`` at it before any metric exists, and
  one scrape then sums every process. A process that exits is marked dead (``mark_process_dead``).
- The informers, the Celery worker and Celery beat serve ``GET /metrics`` over plain HTTP on
  ``GPUSTACK_METRICS_ADDRESS:GPUSTACK_METRICS_PORT`` (0: not served) with ``serve(registry)``, on
  ``guarded_http``'s server: one thread per connection, at most ``GPUSTACK_METRICS_MAX_CONNECTIONS`` open
  at once (one beyond is closed at once), a request's line and headers whole within
  ``GPUSTACK_METRICS_REQUEST_SECONDS`` however slowly they trickle, the answer written whole within as
  long. Anything but ``GET /metrics`` is a 404. Labels there name resources, tasks, outcomes and reasons,
  never a namespace, an object or a node.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

from gpustack_models.guarded_http import ConnectionLimits, GuardedHTTPServer, GuardedRequestHandler

log = logging.getLogger(__name__)

NOT_FOUND = b"404 page not found\n"


def multiprocess_root() -> Path:
    return Path(tempfile.gettempdir()) / "gpustack-models-metrics"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(root: Path, role: str) -> None:
    """Remove the directories of earlier starts of ``role`` whose process is gone."""
    for path in root.glob(f"{role}-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isascii() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def use_multiprocess(role: str) -> Path:
    """Multiprocess mode for this process and those it forks or starts: a fresh directory for this start,
    ``PROMETHEUS_MULTIPROC_DIR`` set to it. Call it before the first metric is made."""
    root = multiprocess_root()
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root, role)
    path = root / f"{role}-{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    from prometheus_client import values

    # prometheus_client picks how values are stored when it is first imported; pick again for the metrics
    # made from now on (a library may have imported it before this process knew its role).
    values.ValueClass = values.get_value_class()
    return path


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def process_exited(pid: int) -> None:
    """Bookkeeping for a process of this multiprocess set that exited (its live gauges go)."""
    if multiprocess():
        from prometheus_client import multiprocess as mp

        mp.mark_process_dead(pid)


def scrape_registry(*collectors):
    """The registry a scrape reads: every process's files in multiprocess mode, else the process's default
    registry; ``collectors`` (read at scrape time) are added to it."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    if not multiprocess():
        for collector in collectors:
            REGISTRY.register(collector)
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    for collector in collectors:
        registry.register(collector)
    return registry


def metrics_app(registry):
    """A WSGI application answering ``GET /metrics`` (and ``HEAD``) with ``registry``, 404 otherwise."""
    from prometheus_client import make_wsgi_app

    exposition = make_wsgi_app(registry)

    def app(environ, start_response):
        if environ.get("PATH_INFO") == "/metrics" and environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            return exposition(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", str(len(NOT_FOUND)))])
        return [NOT_FOUND]

    return app


class _MetricsHandler(GuardedRequestHandler):
    """Answers each request with ``app`` (``metrics_app``), the whole answer in one write: the write
    deadline (``ConnectionLimits.request``) holds for all of it, however slowly the client reads."""

    app = None  # set on the subclass ``serve`` makes

    def log_message(self, format, *args):  # scrapes are not worth a log line each
        pass

    def _answer(self):
        path, _, query = self.path.partition("?")
        environ = {
            "REQUEST_METHOD": "GET" if self.command == "HEAD" else self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "HTTP_ACCEPT": self.headers.get("Accept", ""),
            "HTTP_ACCEPT_ENCODING": self.headers.get("Accept-Encoding", ""),
        }
        answer = {}
        body = b"".join(self.app(environ, lambda status, headers: answer.update(status=status, headers=headers)))
        self.send_response(int(answer["status"].split()[0]))
        for name, value in answer["headers"]:
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if self.command not in ("GET", "HEAD"):  # a body it may have sent is not read: end the connection
            self.send_header("Connection", "close")
        self._headers_buffer.append(b"\r\n" + (b"" if self.command == "HEAD" else body))
        self.flush_headers()

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _answer


def limits_from_settings() -> ConnectionLimits:
    """The metrics port's bounds: ``GPUSTACK_METRICS_MAX_CONNECTIONS``, ``GPUSTACK_METRICS_REQUEST_SECONDS``."""
    from django.conf import settings

    return ConnectionLimits(request=settings.METRICS_REQUEST_SECONDS, connections=settings.METRICS_MAX_CONNECTIONS)


def serve(registry, port: int, address: str = "0.0.0.0", limits: ConnectionLimits | None = None):
    """Serve ``registry`` on ``address:port`` from a daemon thread (``port`` 0: nothing is served), under
    ``limits`` (``ConnectionLimits()`` by default); the running ``GuardedHTTPServer``."""
    if not port:
        return None
    handler = type("MetricsHandler", (_MetricsHandler,), {"app": staticmethod(metrics_app(registry))})
    server = GuardedHTTPServer((address, port), handler, limits or ConnectionLimits())
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", address, server.server_address[1])
    return server


def serve_from_settings(*collectors) -> GuardedHTTPServer | None:
    """The metrics port of a role without an HTTP server (``GPUSTACK_METRICS_PORT``; 0: none)."""
    from django.conf import settings

    if not settings.METRICS_PORT:
        return None
    return serve(scrape_registry(*collectors), settings.METRICS_PORT, settings.METRICS_ADDRESS, limits_from_settings())
