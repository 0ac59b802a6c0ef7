from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpustack_models import kube
from gpustack_models.install.install_checks import API_SERVICE, check_install


class Command(BaseCommand):
    help = (
        "Check an installed release (the chart's `helm test`): the APIService is Available and serves discovery,"
        " and a ServiceAccount with no grants is refused the API."
    )

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="a ServiceAccount with no grants, in --namespace")
        parser.add_argument("--namespace", default="", help="the tenant's namespace (default: GPUSTACK_NAMESPACE)")
        parser.add_argument("--api-service", default=API_SERVICE, help="the APIService (version.group)")

    def handle(self, *args, tenant, namespace="", api_service=API_SERVICE, **options):
        try:
            failed = check_install(kube.default(), namespace or settings.NAMESPACE, tenant, api_service,
                                   self.stdout.write)  # fmt: skip
        except kube.StatusError as exc:
            raise CommandError(f"checkinstall could not run: {exc}") from None
        if failed:
            raise CommandError(f"{len(failed)} check(s) failed: " + "; ".join(c.name for c in failed))
        self.stdout.write("checkinstall: every check passed")
