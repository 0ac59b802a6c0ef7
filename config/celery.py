"""The Celery application. Tasks are found in ``gpustack_models.tasks``."""

import os

from celery import Celery

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
