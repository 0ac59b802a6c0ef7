from django.core.management.base import BaseCommand, CommandError

from gpustack_models.install import deploy_files, stale_files


class Command(BaseCommand):
    help = (
        "Write what deploy/ derives from the code (the storage CRDs, RBAC, admission policies) from the "
        "resource definitions, or --check that it is current."
    )

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="fail if deploy/ is stale; write nothing")

    def handle(self, *args, check=False, **options):
        if check:
            stale = stale_files()
            if stale:
                raise CommandError("stale (run `python manage.py writemanifests`): " + ", ".join(map(str, stale)))
            self.stdout.write("deploy/ is up to date")
            return
        for path, text in deploy_files().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            self.stdout.write(f"wrote {path}")
