from django.core.management.base import BaseCommand, CommandError

from gpustack_models.resources.crd import crd_files, stale_files


class Command(BaseCommand):
    help = "Write the storage CRDs to deploy/crds/ from the resource definitions (or --check them)."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="fail if deploy/crds/ is stale; write nothing")

    def handle(self, *args, check=False, **options):
        if check:
            stale = stale_files()
            if stale:
                raise CommandError("stale CRDs (run `python manage.py writecrds`): " + ", ".join(map(str, stale)))
            self.stdout.write("deploy/crds is up to date")
            return
        for path, text in crd_files().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            self.stdout.write(f"wrote {path}")
