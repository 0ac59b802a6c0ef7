import os
import signal
import subprocess
import sys
import threading
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from gpustack_models.localcluster import REPO_DIR, LocalCluster, Ports


class Command(BaseCommand):
    help = (
        "Run the whole service locally on its embedded defaults: the local control plane with the CRDs, "
        "the database (SQLite unless DATABASE_URL says otherwise) and the Django server. Ctrl-C stops all."
    )

    def add_arguments(self, parser):
        parser.add_argument("--console", default=os.environ.get("GPUSTACK_CONSOLE_ADDR", "127.0.0.1:8000"),
                            help="address of the Django server (default GPUSTACK_CONSOLE_ADDR or 127.0.0.1:8000)")

    def handle(self, *args, console, **options):
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        cluster = LocalCluster(
            settings.DATA_DIR, ports=Ports.defaults(), compaction_interval=settings.ETCD_COMPACTION_INTERVAL
        )
        children: list[subprocess.Popen] = []
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            self.stdout.write("starting the local control plane (the first run builds it: 10-20 minutes)")
            try:
                cluster.start()
            except RuntimeError as exc:
                raise CommandError(str(exc)) from None
            subprocess.run(
                [str(cluster.kubectl), f"--kubeconfig={cluster.kubeconfig}", "apply", "--server-side",
                 "--force-conflicts", "-f", str(REPO_DIR / "deploy" / "crds")],
                check=True, stdout=subprocess.DEVNULL,
            )
            call_command("migrate", interactive=False, verbosity=0)
            env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
            children.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", console,
                     "--workers", "2", "--access-logfile", "-"],
                    cwd=REPO_DIR, env=env,
                )
            )
            self.stdout.write(self.style.SUCCESS(
                f"\ngpustack-models is running (Kubernetes {cluster.version})\n"
                f"  kubeconfig: {cluster.kubeconfig}\n"
                f"  kubectl:    {cluster.kubectl}\n"
                f"  console:    http://{console}/admin/\n"
                f"  try:        {cluster.kubectl} --kubeconfig {cluster.kubeconfig} get crds\n"
                "Ctrl-C stops everything."
            ))
            while not stop.is_set():
                for child in children:
                    if child.poll() is not None:
                        raise CommandError(f"{child.args[2]} exited with {child.returncode}")
                time.sleep(0.5)
        finally:
            for child in children:
                if child.poll() is None:
                    child.terminate()
            for child in children:
                try:
                    child.wait(15)
                except subprocess.TimeoutExpired:
                    child.kill()
            cluster.stop()
            self.stdout.write("stopped")
