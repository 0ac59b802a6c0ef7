"""The Celery application. Tasks are found in ``gpustack_models.tasks``."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gpustack_models")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _prepare_filesystem_broker(sender, **kwargs):
    """The filesystem transport expects its folders to exist; create them on first use."""
    options = sender.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder"):
        if options.get(key):
            os.makedirs(options[key], exist_ok=True)
    backend = sender.conf.result_backend or ""
    if backend.startswith("file://"):
        os.makedirs(backend[len("file://"):], exist_ok=True)
