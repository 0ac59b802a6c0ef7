import os
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpustack_models.local.stack import LocalStack
from gpustack_models.stop_signals import on_stop_signals


class Command(BaseCommand):
    help = (
        "Run the whole service locally on its embedded defaults: the local control plane, the CRDs, RBAC and "
        "admission policies, the aggregated API worker.gpustack.ai/v1, the informers, a Celery worker with beat, "
        "one local node with its plugin, and the admin console (SQLite and a "
        "file-based Celery broker unless DATABASE_URL / CELERY_BROKER_URL say otherwise). Ctrl-C or SIGTERM "
        "stops all of it within 10 seconds."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--console",
            default=os.environ.get("GPUSTACK_CONSOLE_ADDR", "127.0.0.1:8000"),
            help="address of the admin console (default GPUSTACK_CONSOLE_ADDR or 127.0.0.1:8000)",
        )

    def handle(self, *args, console, **options):
        stack = LocalStack(settings.DATA_DIR, console)
        stop, running = threading.Event(), threading.Event()

        def while_starting():
            if not running.is_set():  # still starting: give up on the start, stop what it started
                raise Interrupted

        on_stop_signals(stop.set, in_handler=while_starting)
        try:
            self.stdout.write("starting the local control plane (the first run builds it: 10-20 minutes)")
            stack.start()
            running.set()
            stack.write_endpoints()
            self.stdout.write(self.style.SUCCESS(stack.banner()))
            self.stdout.flush()
            stack.supervise(stop)
        except Interrupted:
            pass
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        finally:
            running.set()  # a second signal while stopping changes nothing
            self.stdout.write("stopping (at most 10 seconds)")
            self.stdout.flush()
            stack.stop()
            self.stdout.write("stopped")


class Interrupted(BaseException):  # not an error: nothing may catch it on the way out
    """SIGTERM or Ctrl-C while the stack was starting."""
