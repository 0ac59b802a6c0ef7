"""Settings come from the environment and are validated at start."""

import os
import subprocess
import sys

import pytest
from django.db import connection

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_with(**env):
    """Start Django the way every entry point does (``django.setup()``) under the given variables."""
    full = dict(os.environ, **env)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.DATABASES['default']['ENGINE'], settings.CELERY_BROKER_URL)",
        ],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.django_db
def test_it_runs_the_suite_on_the_database_the_test_command_started():
    assert connection.vendor == os.environ.get("GPUSTACK_TEST_DATABASE", "postgresql")


def test_it_defaults_to_sqlite_and_a_file_broker():
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.DATABASES['default']['ENGINE'], settings.CELERY_BROKER_URL)",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    engine, broker = proc.stdout.split()
    assert engine == "django.db.backends.sqlite3" and broker.startswith("filesystem://")


@pytest.mark.parametrize(
    "name,value,complaint",
    [
        ("DATABASE_URL", "mysql://x/y", "only sqlite and postgres"),
        ("DATABASE_URL", "nonsense", "DATABASE_URL"),
        ("CELERY_BROKER_URL", "kafka://x", "CELERY_BROKER_URL"),
        ("DEBUG", "perhaps", "DEBUG"),
        ("KUBE_REQUEST_TIMEOUT", "soon", "KUBE_REQUEST_TIMEOUT"),
    ],
)
def test_it_refuses_a_malformed_variable_at_start(name, value, complaint):
    proc = start_with(**{name: value})
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr
    assert complaint in proc.stderr
