"""gunicorn's server hooks of the API (``runapiserver`` passes this module as gunicorn's configuration;
the command line sets everything else)."""

from gpustack_models.telemetry.registry import process_exited


def child_exit(server, worker):
    """A worker process exited: its live gauges leave the metrics (prometheus_client's multiprocess mode)."""
    process_exited(worker.pid)
