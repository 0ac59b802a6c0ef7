from django.core.management.base import BaseCommand, CommandError

from gpustack_models.install.values_doc import DOC, MissingDescription, stale, values_doc


class Command(BaseCommand):
    help = "Write docs/values.md, the chart's values table, from values.schema.json, or --check that it is current."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="fail if docs/values.md is stale; write nothing")

    def handle(self, *args, check=False, **options):
        try:
            text = values_doc()
            if check:
                if stale():
                    raise CommandError("stale (run `python manage.py chartvalues`): " + str(DOC))
                self.stdout.write("docs/values.md is up to date")
                return
        except MissingDescription as exc:
            raise CommandError(str(exc)) from None
        DOC.write_text(text)
        self.stdout.write(f"wrote {DOC}")
