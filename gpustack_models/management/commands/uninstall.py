from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpustack_models import kube
from gpustack_models.install.uninstall import UninstallError, uninstall


class Command(BaseCommand):
    help = (
        "Before a release is deleted (the chart's pre-delete hook): mark its plugin Pods as uninstalling, stop its"
        " controllers and remove the product's finalizers from every storage object, so namespaces and the CRDs"
        " can be deleted afterwards. Idempotent."
    )

    def add_arguments(self, parser):
        parser.add_argument("--release", required=True, help="the Helm release (app.kubernetes.io/instance)")
        parser.add_argument("--namespace", default="", help="the release's namespace (default: GPUSTACK_NAMESPACE)")
        parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the controllers")

    def handle(self, *args, release, namespace="", timeout=300.0, **options):
        try:
            uninstall(kube.default(), namespace or settings.NAMESPACE, release, timeout, self.stdout.write)
        except (UninstallError, kube.StatusError) as exc:
            raise CommandError(f"uninstall did not finish: {exc}") from None
        self.stdout.write("uninstall: done")
