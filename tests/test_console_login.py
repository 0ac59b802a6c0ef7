"""The console's sign-in under a password guesser: failures are counted per username and client address; past
the limit that pair is refused, even with the right password, until the cool-off ends; the client address is the
connection's peer, so a forged X-Forwarded-For neither dodges nor resets the count, and the header is read only
from a trusted proxy (where what the client wrote left of the proxy's entry is ignored too)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest
import requests
from requests.adapters import HTTPAdapter

from tests.support import REPO, wait_for
from tests.support.console import running_console

FAILURES = 3  # GPUSTACK_CONSOLE_LOGIN_FAILURES of this file's console
# GPUSTACK_CONSOLE_LOCKOUT_SECONDS: also how far apart failures may be and still add up (a failure older than that
# is forgotten), so it is longer than a loaded machine takes between two sign-ins (password hashing included).
LOCKOUT = 12
PROXY = "127.0.0.3"  # the only trusted proxy (an Ingress controller's address)
WRONG = "Please enter the correct username and password"


@pytest.fixture(scope="module")
def console(worker_stack):
    env = dict(
        worker_stack.env(),
        GPUSTACK_CONSOLE_LOGIN_FAILURES=str(FAILURES),
        GPUSTACK_CONSOLE_LOCKOUT_SECONDS=str(LOCKOUT),
        GPUSTACK_CONSOLE_TRUSTED_PROXIES=f"{PROXY}/32",
    )
    with running_console(env, "console-login.log") as url:
        yield url, env


@pytest.fixture
def users(console):
    """``users(n)``: ``n`` new staff accounts, ``[(username, password)]``."""

    def make(count: int) -> list[tuple[str, str]]:
        accounts = [(f"staff-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex) for _ in range(count)]
        code = (
            "from django.contrib.auth.models import User\n"
            f"for name, password in {accounts!r}:\n"
            "    User.objects.create_superuser(name, f'{name}@example.com', password)\n"
        )
        subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO, env=console[1], check=True)
        return accounts

    return make


class _From(HTTPAdapter):
    """Connections from ``source``, a loopback address of this host: another client as the console sees it."""

    def __init__(self, source: str):
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


class Browser:
    def __init__(self, url: str, source: str = "127.0.0.1"):
        self.url = url
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.mount("http://", _From(source))

    def sign_in(self, username: str, password: str, forwarded_for: str | None = None) -> requests.Response:
        """The login form posted as a browser posts it (with its CSRF token); a redirect is not followed."""
        headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
        login = f"{self.url}/admin/login/?next=/admin/"
        assert self.session.get(login, headers=headers, timeout=10).status_code == 200
        form = {
            "csrfmiddlewaretoken": self.session.cookies["csrftoken"],
            "username": username,
            "password": password,
            "next": "/admin/",
        }
        return self.session.post(login, data=form, headers=headers, allow_redirects=False, timeout=10)

    def signed_in(self) -> bool:
        return self.session.get(f"{self.url}/admin/", allow_redirects=False, timeout=10).status_code == 200


def _refused(resp: requests.Response) -> bool:
    return (
        resp.status_code == 429 and "Sign-in refused" in resp.text and 1 <= int(resp.headers["Retry-After"]) <= LOCKOUT
    )


def guess(browser: Browser, username: str, forwarded: list[str | None]) -> float:
    """Wrong passwords, one per X-Forwarded-For of ``forwarded``: each but the last answered as a wrong password,
    the last refused (the limit reached, however the header changed). When the last was sent (monotonic)."""
    for forwarded_for in forwarded[:-1]:
        resp = browser.sign_in(username, "wrong-password", forwarded_for)
        assert resp.status_code == 200 and WRONG in resp.text, (forwarded_for, resp.status_code)
    sent = time.monotonic()
    resp = browser.sign_in(username, "wrong-password", forwarded[-1])
    assert _refused(resp), (resp.status_code, resp.headers, resp.text[:300])
    return sent


def test_a_guesser_is_refused_even_the_right_password_until_the_cool_off_ends_whatever_x_forwarded_for_says(
    console, users
):
    url, _ = console
    [(username, password)] = users(1)
    browser = Browser(url)
    # Each guess claims another client: the count is the peer's all the same.
    last = guess(browser, username, [f"203.0.113.{i}" for i in range(FAILURES)])
    for forwarded_for in (None, "198.51.100.7", "127.0.0.2", f"{PROXY}, 198.51.100.8"):
        resp = browser.sign_in(username, password, forwarded_for)
        assert _refused(resp), (forwarded_for, resp.status_code)
        assert not browser.signed_in()
    # The refusal ends on time: tried again and again with the right password meanwhile (refused attempts are
    # not counted, so they do not prolong it), and never before the cool-off from the last counted failure.
    resp = wait_for(
        lambda: (r := browser.sign_in(username, password)).status_code == 302 and r, timeout=LOCKOUT + 20, interval=0.5
    )
    assert time.monotonic() - last >= LOCKOUT
    assert resp.headers["Location"] == "/admin/" and browser.signed_in()


def test_failures_count_per_username_and_address_and_a_success_clears_them(console, users):
    url, _ = console
    [(locked, password), (other, other_password)] = users(2)
    guess(Browser(url), locked, [None] * FAILURES)
    # Another account from the same address, the same account from another address: not refused.
    here = Browser(url)
    assert here.sign_in(other, other_password).status_code == 302 and here.signed_in()
    elsewhere = Browser(url, source="127.0.0.2")
    assert elsewhere.sign_in(locked, password).status_code == 302 and elsewhere.signed_in()
    # Failures short of the limit, then a success: the count starts again from nothing.
    there = Browser(url, source="127.0.0.4")
    for _ in range(FAILURES - 1):
        assert there.sign_in(locked, "wrong-password").status_code == 200
    assert there.sign_in(locked, password).status_code == 302
    retry = Browser(url, source="127.0.0.4")
    for _ in range(FAILURES - 1):
        assert retry.sign_in(locked, "wrong-password").status_code == 200
    assert retry.sign_in(locked, password).status_code == 302


def test_behind_a_trusted_proxy_the_client_is_the_address_the_proxy_appended(console, users):
    url, _ = console
    [(username, password)] = users(1)
    proxy = Browser(url, source=PROXY)
    # The client (203.0.113.50) writes what it likes left of the proxy's entry: counted against it all the same.
    guess(proxy, username, [f"198.51.100.{i}, 203.0.113.50" for i in range(FAILURES)])
    resp = proxy.sign_in(username, password, "203.0.113.51, 203.0.113.50")
    assert _refused(resp)
    # Another client behind the same proxy is not refused.
    other = Browser(url, source=PROXY)
    assert other.sign_in(username, password, "203.0.113.51").status_code == 302 and other.signed_in()
