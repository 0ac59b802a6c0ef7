"""What a fetch ticket carries for a registry or an S3 source, read from the tenant's Secret: the registry's
``base64(user:password)``, an S3 Secret's keys under either name, and one pre-signed link per pinned object
(unsigned without a Secret, none when the Secret is unusable)."""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from urllib.parse import parse_qsl, urlsplit

import pytest

from gpustack_models import kube
from gpustack_models.internal import source_credentials
from gpustack_models.sources.s3_links import Keys

REGISTRY = "https://registry.example:5000"
ENDPOINT = "http://127.0.0.1:9000"
ACCESS, SECRET = "AKIAEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"


def b64(text: str | bytes) -> str:
    return base64.b64encode(text if isinstance(text, bytes) else text.encode()).decode()


class Secrets:
    """kube.default()'s reads of Secrets: ``{name: data}`` of one namespace; any other is not found."""

    def __init__(self, namespace: str = "ns", **secrets: dict):
        self.namespace, self.secrets, self.reads = namespace, secrets, []

    def get(self, path):
        self.reads.append(path)
        prefix = f"/api/v1/namespaces/{self.namespace}/secrets/"
        name = path.removeprefix(prefix)
        if not path.startswith(prefix) or name not in self.secrets:
            raise kube.NotFound(f"secrets {name!r} not found")
        return {"kind": "Secret", "data": self.secrets[name]}


@pytest.fixture
def secrets(monkeypatch):
    """Install the Secrets the functions read (through the module's ``kube.default``)."""

    def install(**named) -> Secrets:
        fake = Secrets(**named)
        monkeypatch.setattr(source_credentials.kube, "default", lambda: fake)
        return fake

    return install


def dockerconfig(auths: dict) -> dict:
    return {".dockerconfigjson": b64(json.dumps({"auths": auths}))}


# ---------------------------------------------------------------- registry tokens


def test_a_registry_token_is_the_base64_credentials_of_that_registrys_entry(secrets):
    secrets(pull=dockerconfig({"other.example": {"auth": b64("o:1")}, "registry.example:5000": {"auth": b64("u:p w")}}))
    assert source_credentials.registry_token("ns", "pull", REGISTRY) == b64("u:p w")
    assert source_credentials.registry_token("ns", "pull", "https://other.example") == b64("o:1")
    assert source_credentials.registry_token("ns", "pull", "https://third.example") is None


def test_a_registry_token_of_username_and_password_fields(secrets):
    secrets(pull=dockerconfig({"registry.example:5000": {"username": "robot", "password": "pw"}}))
    assert source_credentials.registry_token("ns", "pull", REGISTRY) == b64("robot:pw")


@pytest.mark.parametrize(
    "data",
    [
        {},  # no .dockerconfigjson
        {"token": b64("hf_x")},
        {".dockerconfigjson": b64("{not json")},
        {".dockerconfigjson": "not base64!"},
        {".dockerconfigjson": b64(b"\xff\xfe")},
        {".dockerconfigjson": b64(json.dumps(["a list"]))},
        {".dockerconfigjson": b64(json.dumps({"credHelpers": {}}))},
        dockerconfig({"registry.example:5000": {"auth": "dTpw IGF1dGg="}}),  # an auth with a space
        dockerconfig({"registry.example:5000": {"auth": b64("no-colon")}}),
        dockerconfig({"registry.example:5000": {"auth": b64("u:" + "p" * 4096)}}),  # too long for a ticket
    ],
    ids=["none", "hub-token", "bad-json", "not-base64", "not-utf8", "list", "no-auths", "space", "colon", "long"],
)
def test_no_registry_token_from_a_secret_without_usable_credentials(secrets, data):
    secrets(pull=data)
    assert source_credentials.registry_token("ns", "pull", REGISTRY) is None


def test_no_registry_token_from_a_missing_secret_or_another_namespaces(secrets):
    fake = secrets(pull=dockerconfig({"registry.example:5000": {"auth": b64("u:p")}}))
    assert source_credentials.registry_token("ns", "gone", REGISTRY) is None
    assert source_credentials.registry_token("other", "pull", REGISTRY) is None
    assert fake.reads == ["/api/v1/namespaces/ns/secrets/gone", "/api/v1/namespaces/other/secrets/pull"]


# ---------------------------------------------------------------- S3 keys


@pytest.mark.parametrize(
    "data",
    [
        {"accessKeyId": b64(ACCESS), "secretAccessKey": b64(SECRET)},
        {"AWS_ACCESS_KEY_ID": b64(ACCESS), "AWS_SECRET_ACCESS_KEY": b64(SECRET)},
        {"accessKeyId": b64(ACCESS + "\n"), "secretAccessKey": b64(f" {SECRET}\n")},  # as `echo` leaves them
        {"accessKeyId": b64(ACCESS), "AWS_SECRET_ACCESS_KEY": "", "secretAccessKey": b64(SECRET)},
        {"accessKeyId": b64(ACCESS), "AWS_ACCESS_KEY_ID": b64(ACCESS), "AWS_SECRET_ACCESS_KEY": b64(SECRET)},
    ],
    ids=["ours", "aws", "newlines", "ours-among-empty", "aws-when-ours-is-half"],
)
def test_s3_keys_are_read_under_either_name(secrets, data):
    secrets(s3=data)
    keys = source_credentials.s3_keys("ns", "s3")
    assert keys == Keys(ACCESS, SECRET)


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"accessKeyId": b64(ACCESS)},
        {"secretAccessKey": b64(SECRET)},
        {"accessKeyId": b64(ACCESS), "AWS_SECRET_ACCESS_KEY": b64(SECRET)},  # a pair of mixed names
        {"accessKeyId": "", "secretAccessKey": ""},
        {"accessKeyId": "not base64!", "secretAccessKey": b64(SECRET)},
        {"accessKeyId": b64(b"\xff"), "secretAccessKey": b64(SECRET)},
    ],
    ids=["empty", "no-secret", "no-id", "mixed", "blank", "not-base64", "not-utf8"],
)
def test_no_s3_keys_from_a_secret_without_a_usable_pair(secrets, data):
    secrets(s3=data)
    assert source_credentials.s3_keys("ns", "s3") is None


def test_no_s3_keys_without_a_secret_or_from_a_missing_one(secrets):
    fake = secrets()
    assert source_credentials.s3_keys("ns", "") is None
    assert fake.reads == []  # no Secret named: none read
    assert source_credentials.s3_keys("ns", "gone") is None


# ---------------------------------------------------------------- S3 links

PINNED = {
    "region": "eu-west-3",
    "files": {
        "config.json": {"key": "models/config.json", "etag": '"e1"', "versionId": "v1"},
        "sub/model a.bin": {"key": "models/sub/model a.bin", "etag": '"e2"'},
    },
}


def row(pinned=PINNED):
    return SimpleNamespace(endpoint=ENDPOINT, repository="bucket", objects_pinned=pinned, secret_name="s3")


def signed(url: str) -> tuple[str, dict[str, str]]:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}", dict(parse_qsl(parts.query))


def test_it_links_every_pinned_object_pre_signed_for_the_configured_time(secrets, settings):
    settings.S3_LINK_SECONDS = 900
    secrets(s3={"accessKeyId": b64(ACCESS), "secretAccessKey": b64(SECRET)})
    links = source_credentials.object_links("ns", "s3", row())
    assert set(links) == {"config.json", "sub/model a.bin"}
    config, query = signed(links["config.json"])
    assert config == f"{ENDPOINT}/bucket/models/config.json"
    assert query["versionId"] == "v1"
    assert query["X-Amz-Expires"] == "900"
    assert query["X-Amz-Credential"].startswith(f"{ACCESS}/") and "/eu-west-3/s3/" in query["X-Amz-Credential"]
    weights, query = signed(links["sub/model a.bin"])
    assert weights == f"{ENDPOINT}/bucket/models/sub/model%20a.bin"
    assert "versionId" not in query and len(query["X-Amz-Signature"]) == 64
    assert not any(SECRET in link or "K7MDENG" in link for link in links.values())


def test_without_a_secret_the_links_are_unsigned(secrets):
    fake = secrets()
    links = source_credentials.object_links("ns", "", row())
    assert links == {
        "config.json": f"{ENDPOINT}/bucket/models/config.json?versionId=v1",
        "sub/model a.bin": f"{ENDPOINT}/bucket/models/sub/model%20a.bin",
    }
    assert fake.reads == []


@pytest.mark.parametrize(
    "named",
    [{}, {"s3": {}}, {"s3": {"accessKeyId": b64(ACCESS)}}, {"s3": {"token": b64("hf_x")}}],
    ids=["missing", "empty", "half", "a-hub-token"],
)
def test_a_named_but_unusable_secret_gives_no_links_rather_than_unsigned_ones(secrets, named):
    secrets(**named)
    assert source_credentials.object_links("ns", "s3", row()) == {}


def test_a_region_not_pinned_is_us_east_1(secrets):
    secrets(s3={"AWS_ACCESS_KEY_ID": b64(ACCESS), "AWS_SECRET_ACCESS_KEY": b64(SECRET)})
    links = source_credentials.object_links("ns", "s3", row({"files": PINNED["files"]}))
    assert all("/us-east-1/s3/" in signed(link)[1]["X-Amz-Credential"] for link in links.values())


@pytest.mark.parametrize("pinned", [{}, None, {"region": "eu-west-3"}, {"region": "eu-west-3", "files": {}}])
def test_a_resolution_without_pinned_objects_has_no_links(secrets, pinned):
    secrets(s3={"accessKeyId": b64(ACCESS), "secretAccessKey": b64(SECRET)})
    assert source_credentials.object_links("ns", "s3", row(pinned)) == {}
    assert source_credentials.object_links("ns", "", row(pinned)) == {}
