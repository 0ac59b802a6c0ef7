import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from gpustack_models import telemetry
from gpustack_models.worker import worker_metrics
from gpustack_models.worker.informers import informers, run_all


class Command(BaseCommand):
    help = (
        "List and watch the storage CRDs, Nodes and the plugin's Pods, and hand every event to Celery, "
        "which keeps the mirror."
    )

    def handle(self, *args, **options):
        items = informers(settings.NAMESPACE, settings.PLUGIN_SELECTOR)
        worker_metrics.count_sent_tasks()
        telemetry.serve_from_settings()  # GPUSTACK_METRICS_PORT (0: none)

        def stop(*_):
            for informer in items:
                informer.stop.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        run_all(items)
