"""gunicorn's server hooks of the API (``runapiserver`` passes this module as gunicorn's configuration;
the command line sets everything else)."""

from gpustack_models.startup_objects import set_aside_startup_objects
from gpustack_models.telemetry.registry import process_exited


def post_worker_init(worker):
    """A worker has loaded the application: what it imported is set aside from the garbage collector's
    full collections (``startup_objects``)."""
    set_aside_startup_objects()


def child_exit(server, worker):
    """A worker process exited: its live gauges leave the metrics (prometheus_client's multiprocess mode)."""
    process_exited(worker.pid)
