"""The aggregated API server's HTTP layer: gunicorn's native ASGI worker, extended to pass the client
certificate to the application.

Why this worker: kube-apiserver's front proxy identifies the caller with a client certificate plus one
``X-Remote-Group`` header line per group. gunicorn's WSGI layer joins repeated header lines with commas
(a group named ``a,b`` would become two groups); its ASGI worker keeps the raw lines but does not hand the
verified peer certificate to the application. ``TLSASGIProtocol`` adds the ASGI ``tls`` extension
(``scope["extensions"]["tls"]["client_cert_chain"]``, PEM) to every HTTP scope on a TLS connection, and
sends a streamed response's headers at once instead of with its first body bytes.
One event loop serves every open watch, so watches do not hold a thread each.

``tests/test_server.py`` pins this behaviour against the installed gunicorn: an upgrade that renames the
hooks used here fails there, not in production.
"""

from __future__ import annotations

import ssl
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from functools import wraps

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections, reset_queries
from django.http import HttpResponse
from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.workers import gasgi

from gpustack_models.api import api_metrics, connection_memory
from gpustack_models.api.server_tls import worker_ssl_context
from gpustack_models.api.streaming import close_watches

CLOSE_NOTIFY_SECONDS = 0.5  # while stopping: how long a closed connection may flush before it is aborted
# How long a keep-alive connection waits for its next request: longer than the 90 s kube-apiserver's proxy
# keeps an idle connection to an aggregated server for reuse. A server closing it first races the proxy's
# next request on it, which then fails with 503 "error trying to reach service: EOF".
KEEPALIVE_SECONDS = 120
_idle: weakref.WeakSet = weakref.WeakSet()  # this process's connections waiting for their next request


def _abort(transport) -> None:
    try:
        transport.abort()
    except Exception:  # already gone
        pass


class TLSASGIProtocol(ASGIProtocol):
    def _send_response_start(self, status, headers, request, close=False):
        super()._send_response_start(status, headers, request, close=close)
        # gunicorn holds the headers back to send them with the first body bytes. A watch with nothing to
        # report yet must still start (clients wait for the status line), so a streamed (chunked)
        # response sends its headers at once.
        if any(name.lower() == b"transfer-encoding" for name, _ in headers if isinstance(name, bytes)):
            buffer, self._response_buffer = self._response_buffer, None
            if buffer and self.transport is not None and not self.transport.is_closing():
                self.transport.write(buffer)

    def _close_transport(self):
        """While the worker stops, a TLS connection closed here is also aborted shortly after: its close
        waits for the client's close_notify, which a client keeping the connection in its pool never
        sends, and the worker would wait for that connection until its graceful timeout."""
        transport = self.transport
        super()._close_transport()
        if transport is not None and not self.worker.alive:
            self.worker.loop.call_later(CLOSE_NOTIFY_SECONDS, _abort, transport)

    def _arm_keepalive_timer(self):
        if not self.worker.alive:
            # Stopping: a connection that turns idle now (its answer was sent before the signal, the call
            # behind it ended after) waits for no next request.
            self._keepalive_timeout()
            return
        super()._arm_keepalive_timer()
        _idle.add(self)

    def _cancel_keepalive_timer(self):
        super()._cancel_keepalive_timer()
        _idle.discard(self)

    def _build_http_scope(self, request, sockname, peername):
        scope = super()._build_http_scope(request, sockname, peername)
        ssl_object = self.transport.get_extra_info("ssl_object") if self.transport else None
        if ssl_object is not None:
            der = ssl_object.getpeercert(binary_form=True)
            tls = {
                "server_cert": None,
                "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
                "client_cert_name": None,
                "client_cert_error": None,
                "tls_version": None,
                "cipher_suite": None,
            }
            scope.setdefault("extensions", {})["tls"] = tls
        return scope


class TLSASGIWorker(gasgi.ASGIWorker):
    """gunicorn's ASGI worker serving ``TLSASGIProtocol`` connections, its TLS context kept current with its
    files (``_get_ssl_context``). On SIGTERM (and SIGINT, SIGQUIT) it
    ends its open watches and closes its idle keep-alive connections at once: either would otherwise hold
    the worker until its graceful timeout."""

    def init_process(self):
        # The worker builds its protocol through the module-level name; rebind it in this process only.
        gasgi.ASGIProtocol = TLSASGIProtocol
        connection_memory.apply()
        super().init_process()

    def _get_ssl_context(self):
        """The listener's context: certificate, key and client CAs reloaded when they change
        (``api.server_tls``). Never ``None`` on a TLS port: gunicorn's falls back to plain HTTP on a failure."""
        if not self.cfg.is_ssl:
            return None
        return worker_ssl_context(self.cfg.certfile, self.cfg.keyfile)

    def handle_exit_signal(self):
        super().handle_exit_signal()
        self._end_watches()

    def handle_quit_signal(self):
        super().handle_quit_signal()
        self._end_watches()

    def _end_watches(self):
        closed = close_watches()
        if closed:
            self.log.info("stopping: ended %d open watches", closed)
        idle = list(_idle)
        for protocol in idle:
            _idle.discard(protocol)
            protocol._keepalive_timeout()
        if idle:
            self.log.info("stopping: closed %d idle connections", len(idle))


_executor: ThreadPoolExecutor | None = None


def _api_executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=settings.API_THREADS, thread_name_prefix="api")
    return _executor


def _run_view(view, request, *args, **kwargs):
    close_old_connections()
    try:
        return rendered(view(request, *args, **kwargs))
    finally:
        close_old_connections()


def rendered(response):
    """A DRF ``Response`` rendered here, on the pool thread, as a plain ``HttpResponse``.

    Django's async handler renders any response with a ``render`` method through a hop to its one
    thread-sensitive thread, which costs every API request a fraction of a millisecond and serialises
    rendering across requests."""
    if not callable(getattr(response, "render", None)):
        return response
    response.render()
    plain = HttpResponse(response.content, status=response.status_code)
    for header, value in response.items():
        plain[header] = value
    return plain


def threaded(view, route: str = ""):
    """Serve a sync (DRF) view from the ASGI event loop on a shared pool of threads, counting each answer
    in the API's metrics under ``route`` (see ``api_metrics.labels``).

    Django would run it in a thread of its own made for each request, after hopping to other threads for
    the request signals; one hop to a long-lived pool costs a fraction of that. A watch hands its stream
    back to the event loop, so an open watch holds no thread.
    """

    @wraps(view)
    async def async_view(request, *args, **kwargs):
        started, code = time.perf_counter(), 500
        try:
            response = await sync_to_async(_run_view, thread_sensitive=False, executor=_api_executor())(
                view, request, *args, **kwargs
            )
            code = response.status_code
            return response
        finally:
            api_metrics.observe(request, kwargs, route, code, started)

    async_view.csrf_exempt = True
    return async_view


def quiet_request_signals() -> None:
    """In the API server the database handlers of the request signals run around each view instead
    (``_run_view``): as signal receivers the ASGI handler would run them on threads of their own."""
    signals.request_started.disconnect(reset_queries)
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)


class APIHandler(ASGIHandler):
    """Django's ASGI handler without its per-request ``ThreadSensitiveContext``: that context makes a new
    thread for every request (for the thread-sensitive ``response.close()`` at its end), about a fifth of
    a millisecond of each webhook call and facade get. The API's views run on their own pool (``threaded``),
    never thread-sensitive, and the request signals' database handlers are detached
    (``quiet_request_signals``); what is left thread-sensitive (closing a plain response) goes to asgiref's
    one shared thread."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"the API serves HTTP connections only, not {scope['type']}")
        await self.handle(scope, receive, send)
