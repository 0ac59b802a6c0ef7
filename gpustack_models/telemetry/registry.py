"""Prometheus metrics of the service's roles: one registry to scrape per process, prometheus_client's
multiprocess mode for the roles that fork worker processes, and the plain metrics port of the roles without an
HTTP server of their own.

- The API (gunicorn, several worker processes) and the Celery worker (a prefork pool) run in
  prometheus_client's multiprocess mode: ``use_multiprocess(role)`` makes a directory of its own for this
  start (``<temp dir>/gpustack-models-metrics/<role>-<pid>``, emptied; those of earlier starts whose
  process is gone are removed), points ``PROMETHEUS_MULTIPROC_DIR`` at it before any metric exists, and
  one scrape then sums every process. A process that exits is marked dead (``mark_process_dead``).
- The informers, the Celery worker and Celery beat serve ``GET /metrics`` over plain HTTP on
  ``GPUSTACK_METRICS_ADDRESS:GPUSTACK_METRICS_PORT`` (0: not served) with ``serve(registry)``: one thread
  per connection (a client that connects and says nothing holds only its own thread, for at most
  ``READ_TIMEOUT`` seconds); anything but ``GET /metrics`` is a 404. Labels there name resources, tasks,
  outcomes and reasons, never a namespace, an object or a node.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger(__name__)

READ_TIMEOUT = 10.0  # seconds a connection of the metrics port may take to send its request
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
        if pid.isdigit() and not _alive(int(pid)):
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


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_TIMEOUT

    def log_message(self, format, *args):  # scrapes are not worth a log line each
        pass


def serve(registry, port: int, address: str = "0.0.0.0") -> _Server | None:
    """Serve ``registry`` on ``address:port`` from a daemon thread (``port`` 0: nothing is served)."""
    if not port:
        return None
    server = make_server(address, port, metrics_app(registry), _Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", address, port)
    return server


def serve_from_settings(*collectors) -> _Server | None:
    """The metrics port of a role without an HTTP server (``GPUSTACK_METRICS_PORT``; 0: none)."""
    from django.conf import settings

    if not settings.METRICS_PORT:
        return None
    return serve(scrape_registry(*collectors), settings.METRICS_PORT, settings.METRICS_ADDRESS)
