"""The Celery application. Tasks are found in ``gpustack_models.reconcilers.tasks``.

Stopping a worker (SIGTERM, or Ctrl-C): Celery's warm shutdown takes no new task and lets the running ones
finish, without a bound. After ``GPUSTACK_CELERY_SHUTDOWN_GRACE_SECONDS`` the worker turns it into Celery's
cold shutdown: the tasks still running are cancelled and, being ``acks_late`` and not acknowledged, are
delivered again by the broker to the next worker (every task is safe to run twice). So a worker stops
within the grace plus a second or two, and no task is lost.
"""

import os
import signal
import threading

from celery import Celery, signals

from gpustack_models.startup_objects import set_aside_startup_objects
from gpustack_models.telemetry import registry

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpustack_models")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django support closes the database connection after every task unless told how many tasks
# may reuse it; reconnecting to PostgreSQL for each informer event would cap the mirror at ~150 events/s.
# Django's own checks (CONN_MAX_AGE, CONN_HEALTH_CHECKS) run before each task: _checked_database_connection.
app.conf.CELERY_DB_REUSE_MAX = 1000
app.autodiscover_tasks(["gpustack_models.reconcilers"])


@app.on_after_configure.connect
def _prepare_filesystem_broker(sender, **kwargs):
    """The filesystem transport expects its folders to exist; create them on first use."""
    options = sender.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if options.get(key):
            os.makedirs(options[key], exist_ok=True)
    backend = sender.conf.result_backend or ""
    if backend.startswith("file://"):
        os.makedirs(backend[len("file://") :], exist_ok=True)


def _roles():
    """The roles' metrics (``telemetry.roles``), imported by the first signal handler that needs them.

    The one project import inside a function in the Celery processes: that module makes its metrics when
    it is imported, and a worker must choose prometheus_client's multiprocess mode
    (``_worker_metrics_setup``) before any metric exists; this module is imported with Django's settings,
    long before."""
    from gpustack_models.telemetry import roles

    return roles


@signals.task_prerun.connect
def _checked_database_connection(sender=None, **kwargs):
    """Celery's Django support keeps each pool process's database connection across tasks
    (``CELERY_DB_REUSE_MAX``) without Django's checks, so a connection PostgreSQL dropped (a restart, a
    failover) failed every later task of that process. Before each task, Django's own check as before each
    request: a connection past CONN_MAX_AGE, or one that saw an error and no longer answers, is closed, and the
    next query first makes sure the connection works (CONN_HEALTH_CHECKS), reconnecting if not. Not for a
    task run eagerly (inside a caller's transaction, which closing would break)."""
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


@signals.celeryd_init.connect
def _worker_metrics_setup(sender=None, **kwargs):
    """A worker (its prefork pool's processes too) counts its tasks in prometheus_client's multiprocess
    mode, so one scrape of its metrics port sums them; set before any of its metrics exist."""
    registry.use_multiprocess("celery-worker")
    _roles().connect_worker_signals()


@signals.worker_ready.connect
def _serve_worker_metrics(sender=None, **kwargs):
    """The worker's metrics port (``GPUSTACK_METRICS_PORT``), with the broker's queue depth read at scrape
    time; started once the pool's processes exist, so none of them holds the listening socket."""
    registry.serve_from_settings(_roles().QueueDepth(app))


@signals.worker_process_init.connect
def _set_aside_startup_objects(sender=None, **kwargs):
    """A pool process, once forked: what the worker imported is set aside from the garbage collector's full
    collections, which then keep pace with the cycles failed and retried tasks leave (``startup_objects``)."""
    set_aside_startup_objects()


@signals.worker_process_shutdown.connect
def _pool_process_exited(sender=None, pid=None, **kwargs):
    registry.process_exited(pid or os.getpid())


@signals.beat_init.connect
def _serve_beat_metrics(sender=None, **kwargs):
    """Beat's metrics port (``GPUSTACK_METRICS_PORT``): the tasks it sent."""
    _roles().count_sent_tasks()
    registry.serve_from_settings()


@signals.worker_shutting_down.connect
def _bound_warm_shutdown(sender=None, how=None, **kwargs):
    """A warm shutdown (SIGTERM, the first Ctrl-C) becomes a cold one after the grace: SIGQUIT, Celery's
    own signal for it, cancels the tasks still running so that the broker redelivers them."""
    if how != "Warm":
        return
    from django.conf import settings

    timer = threading.Timer(settings.TASKS_SHUTDOWN_GRACE_SECONDS, _cancel_running_tasks, (os.getpid(),))
    timer.daemon = True
    timer.start()


def _cancel_running_tasks(pid: int) -> None:
    from celery.worker import state

    if state.active_requests:  # with none running the warm shutdown is only closing up: let it
        os.kill(pid, signal.SIGQUIT)


@signals.worker_ready.connect
def _stop_blocking_loop_at_once(sender=None, **kwargs):
    """A transport without an event loop (the local file broker) is served by Celery's blocking loop, which
    looks for a stop only between polls of up to two seconds and more; there SIGTERM and SIGINT also end the
    loop at once (as Celery's own handlers did before 5.0), and the worker stops as when its loop notices."""
    connection = getattr(sender, "connection", None)
    if connection is None or connection.transport.implements.asynchronous:
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(signum)
        if callable(handler):
            signal.signal(signum, _and_end_the_loop(handler))


def _and_end_the_loop(handler):
    ended = []

    def handle(signum, frame):
        handler(signum, frame)  # Celery's: the warm shutdown, its messages and signals
        from celery.exceptions import WorkerShutdown
        from celery.worker import state

        if state.should_stop is not None and not ended:
            ended.append(signum)
            raise WorkerShutdown(state.should_stop)

    return handle
