"""Settings come from the environment and are validated at start."""

import os
import shutil
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
        ("GPUSTACK_LEADER_ELECTION", "maybe", "GPUSTACK_LEADER_ELECTION"),
        ("GPUSTACK_LEADER_LEASE_SECONDS", "long", "GPUSTACK_LEADER_LEASE_SECONDS"),
        # A renew deadline past the Lease's duration would let two leaders act at once.
        ("GPUSTACK_LEADER_RENEW_DEADLINE_SECONDS", "20", "must hold (now 15.0 / 20.0 / 2.0)"),
        ("GPUSTACK_LEADER_RETRY_SECONDS", "10", "GPUSTACK_LEADER_RETRY_SECONDS must hold"),
        # A trusted proxy that is no address would trust nothing (or, mistyped, the wrong hosts): refused.
        ("GPUSTACK_CONSOLE_TRUSTED_PROXIES", "10.0.0.0/8, ingress", "'ingress' is not an IP address"),
        ("GPUSTACK_CONSOLE_LOGIN_FAILURES", "0", "GPUSTACK_CONSOLE_LOGIN_FAILURES=0: must be at least 1"),
        ("GPUSTACK_METRICS_MAX_CONNECTIONS", "0", "GPUSTACK_METRICS_MAX_CONNECTIONS=0: must be at least 1"),
        # A mistyped placement mode would silently be neither: refused.
        ("GPUSTACK_PLACEMENT_MODE", "labels", "expected one of clientCertificate, nodeLabels"),
        ("GPUSTACK_PLACEMENT_LABELS_RESYNC_SECONDS", "0", "GPUSTACK_PLACEMENT_LABELS_RESYNC_SECONDS=0"),
    ],
)
def test_it_refuses_a_malformed_variable_at_start(name, value, complaint):
    proc = start_with(**{name: value})
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr
    assert complaint in proc.stderr


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
    """The files the image holds (the repository's, without the development tools), as the Dockerfile
    copies them."""
    root = tmp_path_factory.mktemp("image")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copy(os.path.join(REPO, "manage.py"), root)
    for directory in ("config", "gpustack_models", "templates"):
        shutil.copytree(os.path.join(REPO, directory), root / directory, ignore=skip)
    shutil.rmtree(root / "gpustack_models" / "local")  # .dockerignore keeps it out of the image
    return root


def run_image(root, **env):
    full = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    full.update(env, GPUSTACK_DATA_DIR=str(root / "data"))
    return subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=root, env=full, capture_output=True, text=True, timeout=60
    )


def test_it_refuses_the_built_in_secret_key_outside_a_checkout(image_files):
    refused = run_image(image_files)
    assert refused.returncode != 0 and "SECRET_KEY is required" in refused.stderr
    assert run_image(image_files, SECRET_KEY="a-real-key").returncode == 0
    # A checkout (the development tools are there) runs locally on the built-in key.
    assert start_with(SECRET_KEY="").returncode == 0


def test_it_never_reads_the_plugins_without_verifying_them():
    refused = start_with(GPUSTACK_SERVER_ROLE="api", GPUSTACK_PLUGIN_CA_FILE="")
    assert refused.returncode != 0 and "GPUSTACK_PLUGIN_CA_FILE is empty" in refused.stderr
    assert start_with(GPUSTACK_SERVER_ROLE="console", GPUSTACK_PLUGIN_CA_FILE="").returncode == 0


CONSOLE_COOKIES = (
    "import django; django.setup(); from django.test import Client; "
    "r = Client(HTTP_X_FORWARDED_PROTO='https').get('/admin/login/'); "
    "print(r.status_code, bool(r.cookies['csrftoken']['secure']))"
)


@pytest.mark.parametrize("https, secure", [("true", "True"), ("false", "False")])
def test_it_sends_secure_cookies_when_the_console_is_served_over_https(https, secure):
    env = dict(os.environ, GPUSTACK_CONSOLE_HTTPS=https, GPUSTACK_SERVER_ROLE="console")
    proc = subprocess.run([sys.executable, "-c", CONSOLE_COOKIES], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["200", secure]


CONSOLE_REDIRECT = (
    "import django; django.setup(); from django.test import Client; "
    "plain = Client().get('/admin/login/'); secure = Client(HTTP_X_FORWARDED_PROTO='https').get('/admin/login/'); "
    "print(plain.status_code, plain['Location'], secure.status_code, secure['Strict-Transport-Security'])"
)


def test_a_console_served_over_https_redirects_plain_http_and_sends_hsts():
    env = dict(os.environ, GPUSTACK_CONSOLE_HTTPS="true", GPUSTACK_SERVER_ROLE="console")
    env["GPUSTACK_CONSOLE_HSTS_SECONDS"] = "600"
    proc = subprocess.run([sys.executable, "-c", CONSOLE_REDIRECT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["301", "https://testserver/admin/login/", "200", "max-age=600"]
