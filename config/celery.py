"""The Celery application. Tasks are found in ``gpustack_models.tasks``.

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

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpustack_models")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django support closes the database connection after every task unless told how many tasks
# may reuse it; reconnecting to PostgreSQL for each informer event would cap the mirror at ~150 events/s.
# Django's own CONN_MAX_AGE still retires connections.
app.conf.CELERY_DB_REUSE_MAX = 1000
app.autodiscover_tasks()


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


@signals.worker_shutting_down.connect
def _bound_warm_shutdown(sender=None, how=None, **kwargs):
    """A warm shutdown (SIGTERM, the first Ctrl-C) becomes a cold one after the grace: SIGQUIT, Celery's
    own signal for it, cancels the tasks still running so that the broker redelivers them."""
    if how != "Warm":
        return
    from django.conf import settings

    pid = os.getpid()
    timer = threading.Timer(settings.TASKS_SHUTDOWN_GRACE_SECONDS, os.kill, (pid, signal.SIGQUIT))
    timer.daemon = True
    timer.start()
