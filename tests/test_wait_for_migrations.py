"""``manage.py waitformigrations``, the chart's init container: one process that waits while the database lacks
a migration of this code (on a database of its own on the suite's PostgreSQL, migrated by the test while it
waits), says what it waits for, and exits once the migrate Job is done; a database that does not answer is
waited for too, named, and ``--timeout`` gives up with exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

from tests.support import REPO
from tests.support.release import own_database
from tests.support.worker import postgres_url


def manage(*args: str, database_url: str, **kwargs):
    env = dict(os.environ, DATABASE_URL=database_url, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "manage.py", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)  # fmt: skip


def test_it_waits_while_a_migration_is_missing_and_exits_once_the_migrate_job_applied_them(django_db_blocker):
    with own_database(django_db_blocker) as settings:
        waiting = manage("waitformigrations", "--interval", "0.2", database_url=postgres_url(settings))
        try:
            first = waiting.stdout.readline()
            assert first.startswith("waiting for migrations: "), first
            assert " unapplied, first " in first, first
            assert waiting.poll() is None  # still waiting: nothing migrated yet
            migrate = manage("migrate", "--noinput", "-v0", database_url=postgres_url(settings))
            assert migrate.wait(timeout=300) == 0, migrate.stdout.read()
            assert waiting.wait(timeout=30) == 0
            rest = waiting.stdout.read()
            assert "every migration applied" in rest, first + rest
        finally:
            waiting.kill()
            waiting.wait()


def test_a_database_that_does_not_answer_is_named_and_timeout_gives_up(db_url):
    from gpustack_models.local.cluster import free_port

    closed = urlsplit(db_url)._replace(netloc=f"{urlsplit(db_url).netloc.rpartition(':')[0]}:{free_port()}")
    waiting = manage("waitformigrations", "--interval", "0.2", "--timeout", "2", database_url=urlunsplit(closed))
    code = waiting.wait(timeout=60)
    out = waiting.stdout.read()
    assert code == 1, out
    assert "waiting for migrations: database not answering" in out, out
    assert "migrations still missing after 2s: database not answering" in out, out
    assert out.count("waiting for migrations:") == 1, out  # said once, not at every check
