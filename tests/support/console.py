"""The admin console as a deployment runs it: gunicorn serving ``config.wsgi`` with the service's settings."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

import requests

from gpustack_models.local.cluster import free_port
from tests.support.paths import REPO, TEST_STATE
from tests.support.waiting import wait_for


def _up(session, url):
    try:
        return session.get(f"{url}/admin/login/", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@contextmanager
def running_console(env: dict, log_name: str = "console.log"):
    """A console with ``env`` on a free loopback port, once it answers: its URL; stopped on exit."""
    port = free_port()
    log = open(TEST_STATE / log_name, "ab")
    argv = [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [*argv, "--workers", "1", "--no-control-socket"],
        cwd=REPO,
        env=dict(env, GPUSTACK_SERVER_ROLE="console"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    session = requests.Session()
    session.trust_env = False
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(session, url), timeout=30, message="the console")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
