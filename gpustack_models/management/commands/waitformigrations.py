"""Wait until the database has every migration of this code (the chart's init containers run it).

One process loads Django once and asks the database every ``--interval`` seconds, instead of a shell loop
starting ``migrate --check`` (a whole Django start-up, about two seconds of CPU) every few seconds in every
Pod of a release at once, which slowed the migrate Job they wait for."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor


def unapplied(database: str = "default") -> list[str]:
    """The migrations of this code the database does not have yet, as ``app.name``."""
    connection = connections[database]
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _backwards in plan]


class Command(BaseCommand):
    help = "Wait until the database has every migration of this code (exits 0 then; 1 after --timeout)."

    def add_arguments(self, parser):
        parser.add_argument("--interval", type=float, default=2.0, help="seconds between two checks")
        parser.add_argument("--timeout", type=float, default=0.0, help="give up after this many seconds (0: never)")
        parser.add_argument("--database", default="default")

    def handle(self, *args, interval: float, timeout: float, database: str, **options):
        started = time.monotonic()
        said = None
        while True:
            try:
                missing = unapplied(database)
                state = f"{len(missing)} unapplied, first {missing[0]}" if missing else ""
            except DatabaseError as exc:
                state = f"database not answering: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
                connections[database].close()  # a fresh connection next time
            if not state:
                self.stdout.write(f"every migration applied ({time.monotonic() - started:.0f}s)")
                return
            if state != said:
                self.stdout.write(f"waiting for migrations: {state}")
                said = state
            if timeout and time.monotonic() - started >= timeout:
                raise CommandError(f"migrations still missing after {timeout:.0f}s: {state}")
            time.sleep(interval)
