from django.core.management.base import BaseCommand, CommandError

from gpustack_models import kube
from gpustack_models.install.crd_upgrade import CrdError, apply_crds


class Command(BaseCommand):
    help = (
        "Apply the storage CRDs server-side from the kind definitions (the chart's pre-install and pre-upgrade"
        " hook) and wait until they are Established."
    )

    def add_arguments(self, parser):
        parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for Established")

    def handle(self, *args, timeout=120.0, **options):
        try:
            names = apply_crds(kube.default(), timeout, self.stdout.write)
        except (CrdError, kube.StatusError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"CRDs applied: {len(names)}")
