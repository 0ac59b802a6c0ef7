import sys
import threading

from django.conf import settings
from django.core.management.base import BaseCommand

from gpustack_models.informers.listwatch import informers, run_all
from gpustack_models.kube.leases import elector_for
from gpustack_models.stop_signals import on_stop_signals
from gpustack_models.telemetry import registry, roles


class Command(BaseCommand):
    help = (
        "List and watch the storage CRDs, Nodes and the plugin's Pods, and hand every event to Celery, "
        "which keeps the mirror. With several replicas only the holder of the informers' Lease watches: "
        "the others stand by, and one that loses the Lease exits non-zero (to be restarted as a standby)."
    )

    def handle(self, *args, **options):
        items = informers(settings.NAMESPACE, settings.PLUGIN_SELECTOR)
        roles.count_sent_tasks()
        registry.serve_from_settings()  # GPUSTACK_METRICS_PORT (0: none)
        stopping = threading.Event()

        def stop(*_):
            stopping.set()
            for informer in items:
                informer.stop.set()

        on_stop_signals(stop)
        if not settings.LEADER_ELECTION:
            run_all(items)
            return
        elector = elector_for(settings.LEADER_INFORMERS_LEASE)
        if not elector.acquire(stopping):
            return  # stopped while standing by
        lost = threading.Event()

        def keep():
            if elector.keep(stopping):
                lost.set()
                for informer in items:
                    informer.stop.set()

        threading.Thread(target=keep, name="informers-lease", daemon=True).start()
        run_all(items)  # every watch starts with a full list: a new leader misses nothing
        if lost.is_set():
            sys.exit(1)
        stopping.set()
        elector.release()
