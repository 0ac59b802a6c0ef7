from django.core.management.base import BaseCommand, CommandError

from gpustack_models import kube
from gpustack_models.install.uninstall import UninstallError, release_finalizers


class Command(BaseCommand):
    help = (
        "Remove the product's finalizers from every ModelArtifact, ModelPrefetch and NodeModelStore (run with the"
        " service stopped: a running service adds them again). Idempotent."
    )

    def handle(self, *args, **options):
        try:
            counts = release_finalizers(kube.default(), self.stdout.write)
        except (UninstallError, kube.StatusError) as exc:
            raise CommandError(f"releasing finalizers did not finish: {exc}") from None
        self.stdout.write(f"finalizers removed: {sum(counts.values())}")
