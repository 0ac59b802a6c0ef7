import threading
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpustack_models.local.cluster import LocalCluster, Ports
from gpustack_models.stop_signals import on_stop_signals


class Command(BaseCommand):
    help = (
        "Run the local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) "
        "built from the pinned Kubernetes modules. Actions: run (foreground until Ctrl-C), start (detached), stop, "
        "status, restart-apiserver."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=("run", "start", "stop", "status", "restart-apiserver"))
        parser.add_argument("--state-dir", default=str(settings.DATA_DIR), help="default: GPUSTACK_DATA_DIR")
        parser.add_argument("--apiserver-port", type=int, default=Ports.defaults().apiserver)

    def handle(self, action, state_dir, apiserver_port, **options):
        state = Path(state_dir)
        if action in ("stop", "status", "restart-apiserver"):
            if not (state / "cluster.json").exists():
                raise CommandError(f"no local control plane recorded in {state}")
            cluster = LocalCluster.from_state(state)
            if action == "stop":
                cluster.stop()
                self.stdout.write("stopped")
            elif action == "status":
                self.stdout.write(("running" if cluster.is_running() else "stopped") + f" at {cluster.server}")
                self.stdout.write(f"kubeconfig: {cluster.kubeconfig}")
            else:
                cluster.die_with_parent = False
                cluster.restart_apiserver()
                self.stdout.write("kube-apiserver restarted")
            return
        defaults = Ports.defaults()
        ports = Ports(apiserver_port, defaults.etcd_client, defaults.etcd_peer, defaults.controller_manager)
        cluster = LocalCluster(
            state,
            ports=ports,
            compaction_interval=settings.ETCD_COMPACTION_INTERVAL,
            die_with_parent=(action == "run"),
        )
        try:
            cluster.start()
        except RuntimeError as exc:
            cluster.stop()
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Kubernetes {cluster.version} control plane at {cluster.server}")
        self.stdout.write(f"kubeconfig: {cluster.kubeconfig}")
        self.stdout.write(f"kubectl:    {cluster.kubectl}")
        if action == "start":
            return
        stop = threading.Event()
        on_stop_signals(stop.set)
        stop.wait()
        cluster.stop()
        self.stdout.write("stopped")
