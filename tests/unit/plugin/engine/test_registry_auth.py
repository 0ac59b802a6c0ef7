"""Answering a registry's challenges without a registry: a ``WWW-Authenticate`` value read, a ``Basic``
challenge answered with the source's credential once, a ``Bearer`` one with a token from the realm (the
credential sent over HTTPS or to the registry's own host only), and an answer another request learnt kept."""

from __future__ import annotations

import json

import pytest

from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.registry_auth import RegistryAuth, parse_challenge
from gpustack_models.plugin.engine.ticket import OCI, HubSource
from gpustack_models.sources.hub_errors import ACCESS_DENIED, SOURCE_UNAVAILABLE

COMMIT = "sha256:" + "c" * 64
CREDENTIAL = "cm9ib3Q6czNjcjN0LXB3"  # base64("robot:s3cr3t-pw")
BEARER = 'Bearer realm="https://auth.example/token",service="registry.example",scope="repository:team/model:pull"'


def hub(token: str | None = CREDENTIAL, endpoint: str = "https://registry.example") -> HubSource:
    return HubSource(OCI, endpoint, "team/model", COMMIT, token)


class Answer:
    def __init__(self, status: int, body: str):
        self.status, self.body = status, body

    def text(self, limit: int = 4096) -> str:
        return self.body[:limit]


class TokenService:
    """A connection pool whose every GET is the token service answering ``status`` and ``body``."""

    def __init__(self, status: int = 200, body: str = json.dumps({"token": "t0k3n"})):
        self.status, self.body, self.asked = status, body, []

    def get(self, url, *, credentials, credentials_origin, headers):
        self.asked.append((url, dict(credentials), credentials_origin))
        return Answer(self.status, self.body)


class NoPool:
    """A pool that must not be asked anything."""

    def get(self, *args, **kwargs):
        pytest.fail("the pool was asked for something")


@pytest.mark.parametrize(
    ("header", "scheme", "params"),
    [
        (
            BEARER,
            "bearer",
            {
                "realm": "https://auth.example/token",
                "service": "registry.example",
                "scope": "repository:team/model:pull",
            },
        ),
        ('BEARER Realm="https://a/t",SERVICE="s"', "bearer", {"realm": "https://a/t", "service": "s"}),
        (
            'bearer realm="https://a/t", scope="repository:x:pull,push"',
            "bearer",
            {"realm": "https://a/t", "scope": "repository:x:pull,push"},
        ),
        ('Basic realm="Registry Realm"', "basic", {"realm": "Registry Realm"}),
        ("Basic", "basic", {}),
        ("  basic  ", "basic", {}),
        ("garbage", "garbage", {}),
        ("Bearer realm=unquoted", "bearer", {}),
        ("", "", {}),
        (None, "", {}),
    ],
)
def test_it_reads_a_challenges_scheme_lowercased_and_its_parameters(header, scheme, params):
    assert parse_challenge(header) == (scheme, params)


def test_a_basic_challenge_learns_the_credential_itself():
    auth = RegistryAuth(NoPool())
    assert auth.answer(hub(), 'Basic realm="Registry"', {}) is True
    assert auth.headers(hub()) == {"Authorization": f"Basic {CREDENTIAL}"}


def test_a_basic_challenge_to_the_credential_already_sent_is_refused():
    auth = RegistryAuth(NoPool())
    assert auth.answer(hub(), "Basic", {}) is True
    sent = auth.headers(hub())
    assert auth.answer(hub(), "Basic", sent) is False


def test_a_basic_challenge_to_a_basic_credential_sent_is_refused_even_if_not_learnt_here():
    assert RegistryAuth(NoPool()).answer(hub(), "Basic", {"Authorization": "Basic b3RoZXI6cHc="}) is False


def test_a_basic_challenge_without_a_credential_is_refused():
    auth = RegistryAuth(NoPool())
    assert auth.answer(hub(token=None), 'Basic realm="Registry"', {}) is False
    assert auth.headers(hub(token=None)) == {}


@pytest.mark.parametrize(
    "challenge",
    ['Digest realm="x", nonce="y"', "Negotiate", "", None, "Bearer", 'Bearer service="registry.example"'],
)
def test_an_unknown_scheme_or_a_bearer_without_realm_is_refused(challenge):
    auth = RegistryAuth(NoPool())
    assert auth.answer(hub(), challenge, {}) is False
    assert auth.headers(hub()) == {}


def test_an_answer_another_request_learnt_is_used_without_asking_anything():
    auth = RegistryAuth(NoPool())
    auth.answer(hub(), "Basic", {})
    # A request sent before that answer was learnt is answered 401: it is sent again with the new answer.
    assert auth.answer(hub(), BEARER, {}) is True
    assert auth.answer(hub(), BEARER, {"Authorization": "Bearer expired"}) is True
    assert auth.headers(hub()) == {"Authorization": f"Basic {CREDENTIAL}"}


def test_each_source_learns_its_own_answer():
    auth = RegistryAuth(NoPool())
    auth.answer(hub(), "Basic", {})
    assert auth.headers(hub(token="b3RoZXI6cHc=")) == {}
    assert auth.headers(hub(endpoint="https://mirror.example")) == {}


def test_a_bearer_challenge_asks_the_realm_for_a_token_with_the_credential():
    pool = TokenService()
    auth = RegistryAuth(pool)
    assert auth.answer(hub(), BEARER, {}) is True
    assert auth.headers(hub()) == {"Authorization": "Bearer t0k3n"}
    [(url, credentials, where)] = pool.asked
    assert url == "https://auth.example/token?scope=repository%3Ateam%2Fmodel%3Apull&service=registry.example"
    assert credentials == {"Authorization": f"Basic {CREDENTIAL}"}
    assert where == ("https", "auth.example", 443)


def test_an_expired_bearer_token_is_asked_for_again():
    pool = TokenService()
    auth = RegistryAuth(pool)
    auth.answer(hub(), BEARER, {})
    pool.body = json.dumps({"access_token": "renewed"})
    assert auth.answer(hub(), BEARER, auth.headers(hub())) is True
    assert auth.headers(hub()) == {"Authorization": "Bearer renewed"}
    assert len(pool.asked) == 2


@pytest.mark.parametrize(
    ("realm", "endpoint", "sent"),
    [
        ("https://auth.example/token", "http://registry.example:5000", True),
        ("http://registry.example:5001/token", "http://registry.example:5000", True),  # the registry's host
        ("http://auth.example/token", "http://registry.example:5000", False),  # plain HTTP elsewhere
    ],
)
def test_the_credential_goes_over_https_or_to_the_registrys_own_host(realm, endpoint, sent):
    pool = TokenService()
    RegistryAuth(pool).answer(hub(endpoint=endpoint), f'Bearer realm="{realm}"', {})
    [(url, credentials, _)] = pool.asked
    assert url == f"{realm}?scope=repository%3Ateam%2Fmodel%3Apull"  # the source's own scope when none is given
    assert credentials == ({"Authorization": f"Basic {CREDENTIAL}"} if sent else {})


def test_without_a_credential_the_token_is_asked_for_anonymously():
    pool = TokenService()
    assert RegistryAuth(pool).answer(hub(token=None), BEARER, {}) is True
    assert pool.asked[0][1] == {}


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (401, "", ACCESS_DENIED),
        (403, "", ACCESS_DENIED),
        (500, "", SOURCE_UNAVAILABLE),
        (200, "not json", SOURCE_UNAVAILABLE),
        (200, json.dumps({"nothing": 1}), SOURCE_UNAVAILABLE),
        (200, json.dumps({"token": "with space"}), SOURCE_UNAVAILABLE),
    ],
)
def test_a_token_service_that_refuses_or_answers_no_token_fails_the_download(status, body, reason):
    auth = RegistryAuth(TokenService(status, body))
    with pytest.raises(DownloadFailed) as caught:
        auth.answer(hub(), BEARER, {})
    assert caught.value.reason == reason
    assert CREDENTIAL not in caught.value.message
    assert auth.headers(hub()) == {}


@pytest.mark.parametrize("realm", ["ftp://auth.example/token", "https://user:pw@auth.example/token", "/token"])
def test_a_realm_that_is_not_a_bare_http_url_is_refused_without_asking_it(realm):
    with pytest.raises(DownloadFailed) as caught:
        RegistryAuth(NoPool()).answer(hub(), f'Bearer realm="{realm}"', {})
    assert caught.value.reason == ACCESS_DENIED
