"""gunicorn's server hooks of the API (``runapiserver`` passes this module as gunicorn's configuration;
the command line sets everything else)."""

from gpustack_models.telemetry.registry import process_exited


def child_exit(server, worker):
    """A worker process exited: its live gauges leave the metrics (prometheus_client's multiprocess mode)."""
    process_exited(worker.pid)


def ssl_context(conf, default_factory):
    """The listener's TLS context: the serving certificate and the client CAs, reloaded when they change
    (``api.server_tls``; imported in the worker, where the application is loaded)."""
    from gpustack_models.api.server_tls import gunicorn_ssl_context

    return gunicorn_ssl_context(conf, default_factory)
