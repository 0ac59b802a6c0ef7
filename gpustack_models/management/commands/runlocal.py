import os
import signal
import subprocess
import sys
import threading
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from gpustack_models.launcher import Launcher
from gpustack_models.localcluster import REPO_DIR, LocalCluster, Ports

LOCAL_NODE = "local-node"
LOCAL_NODE_ADDRESS = "127.0.0.11"


class Command(BaseCommand):
    help = (
        "Run the whole service locally on its embedded defaults: the local control plane, the CRDs, RBAC and "
        "admission policies, the aggregated API worker.gpustack.ai/v1, the informers, a Celery worker with beat, "
        "one local node with its plugin, and the admin console (SQLite and a "
        "file-based Celery broker unless DATABASE_URL / CELERY_BROKER_URL say otherwise). Ctrl-C stops all."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--console",
            default=os.environ.get("GPUSTACK_CONSOLE_ADDR", "127.0.0.1:8000"),
            help="address of the admin console (default GPUSTACK_CONSOLE_ADDR or 127.0.0.1:8000)",
        )

    def handle(self, *args, console, **options):
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        cluster = LocalCluster(
            settings.DATA_DIR, ports=Ports.defaults(), compaction_interval=settings.ETCD_COMPACTION_INTERVAL
        )
        children: dict[str, subprocess.Popen] = {}
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        launcher = None
        try:
            self.stdout.write("starting the local control plane (the first run builds it: 10-20 minutes)")
            try:
                cluster.start()
            except RuntimeError as exc:
                raise CommandError(str(exc)) from None
            launcher = Launcher(cluster, settings.DATA_DIR)
            launcher.install()
            launcher.write_worker_kubeconfig()
            cert, key, _ca = launcher.serving_pki()
            call_command("migrate", interactive=False, verbosity=0)
            worker_env = dict(os.environ, KUBECONFIG=str(launcher.worker_kubeconfig))
            log_dir = settings.DATA_DIR / "logs"
            log_dir.mkdir(exist_ok=True)

            def spawn(name, argv, env):
                log = open(log_dir / f"{name}.log", "ab")
                children[name] = subprocess.Popen(argv, cwd=REPO_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)

            spawn(
                "api",
                [
                    sys.executable,
                    "manage.py",
                    "runapiserver",
                    f"--port={settings.API_PORT}",
                    f"--certfile={cert}",
                    f"--keyfile={key}",
                ],
                worker_env,
            )
            spawn(
                "console",
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "config.wsgi:application",
                    "--bind",
                    console,
                    "--workers",
                    "2",
                    "--no-control-socket",
                ],
                worker_env,
            )
            spawn(
                "celery",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "config",
                    "worker",
                    "--pool=prefork",
                    "--concurrency=2",
                    "--beat",
                    "--loglevel=WARNING",
                    "--without-gossip",
                    "--without-mingle",
                ],
                worker_env,
            )
            spawn("informers", [sys.executable, "manage.py", "runinformers"], worker_env)
            # One local node with its plugin, registered as a kubelet would (a Node, a Running plugin Pod).
            plugin_env = launcher.plugin_env(LOCAL_NODE, LOCAL_NODE_ADDRESS, settings.PLUGIN_PORT)
            spawn("plugin", [sys.executable, "manage.py", "runplugin", f"--node={LOCAL_NODE}"], plugin_env)
            launcher.register(settings.API_PORT)
            try:
                launcher.wait_available(timeout=90)
            except RuntimeError as exc:
                raise CommandError(f"{exc}; see {log_dir / 'api.log'}") from None
            kubectl = f"{cluster.kubectl} --kubeconfig {cluster.kubeconfig}"
            self.stdout.write(
                self.style.SUCCESS(
                    f"\ngpustack-models is running (Kubernetes {cluster.version})\n"
                    f"  kubeconfig: {cluster.kubeconfig}\n"
                    f"  kubectl:    {cluster.kubectl}\n"
                    f"  API:        worker.gpustack.ai/v1 through {cluster.server} (worker on :{settings.API_PORT})\n"
                    f"  console:    http://{console}/admin/\n"
                    f"  node:       {LOCAL_NODE} (plugin on {LOCAL_NODE_ADDRESS}:{settings.PLUGIN_PORT}, cache "
                    f"{settings.DATA_DIR / 'plugin' / LOCAL_NODE / 'cache'})\n"
                    f"  logs:       {log_dir}/\n"
                    f"  try:        {kubectl} api-resources --api-group=worker.gpustack.ai\n"
                    "Ctrl-C stops everything."
                )
            )
            while not stop.is_set():
                for name, child in children.items():
                    if child.poll() is not None:
                        raise CommandError(f"{name} exited with {child.returncode}; see {log_dir / (name + '.log')}")
                time.sleep(0.5)
        finally:
            if launcher is not None:
                try:
                    launcher.unregister()
                except Exception:  # the control plane may already be gone
                    pass
            for child in children.values():
                if child.poll() is None:
                    child.terminate()
            for child in children.values():
                try:
                    child.wait(15)
                except subprocess.TimeoutExpired:
                    child.kill()
            cluster.stop()
            self.stdout.write("stopped")
