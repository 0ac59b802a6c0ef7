"""The suite's OCI registry (``tests/support/registry.py``) is a real one: distribution enforces the token
server's grants, refuses forged tokens, and serves a pushed ModelPack artifact byte for byte."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
import requests

from tests.support.registry import (
    FILEPATH,
    MANIFEST_ACCEPT,
    MODEL_ARTIFACT,
    MODEL_WEIGHT,
    MODEL_WEIGHT_CONFIG,
    OCI_INDEX,
    OCI_MANIFEST,
    TITLE,
    RegistryError,
    challenge,
    sha256_digest,
)

FILES = {"config.json": b'{"architectures": ["Tiny"]}', "model.safetensors": bytes(range(256)) * 16}


@pytest.fixture
def space(registry):
    """A namespace of this test's own, a user who may push and pull there and one who may only pull."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    writer = registry.add_user(f"{ns}-writer", uuid.uuid4().hex, pull=f"{ns}/", push=f"{ns}/")
    reader = registry.add_user(f"{ns}-reader", uuid.uuid4().hex, pull=f"{ns}/")
    return ns, writer, reader


def _plain() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    return session


def test_anonymous_manifest_get_is_challenged(registry, space):
    ns, writer, _ = space
    registry.push_modelpack(f"{ns}/model", "v1", FILES, writer)
    response = _plain().get(f"{registry.url}/v2/{ns}/model/manifests/v1", headers={"Accept": MANIFEST_ACCEPT})
    assert response.status_code == 401
    params = challenge(response.headers["WWW-Authenticate"])
    assert params["realm"] == registry.tokens.realm
    assert params["service"] == registry.tokens.service
    assert params["scope"] == f"repository:{ns}/model:pull"
    # Anonymous callers get a token granting nothing, which the registry refuses too.
    with pytest.raises(RegistryError) as refused:
        registry.get_manifest(f"{ns}/model", "v1", None)
    assert refused.value.response.status_code == 401
    assert registry.tokens.requests[-1].username is None
    assert registry.tokens.requests[-1].granted == []


def test_pull_only_user_cannot_push(registry, space):
    ns, _, reader = space
    with pytest.raises(RegistryError) as refused:
        registry.push_blob(f"{ns}/model", b"not allowed", reader)
    assert refused.value.response.status_code in (401, 403)
    assert 'error="insufficient_scope"' in refused.value.response.headers["WWW-Authenticate"]
    asked = registry.tokens.requests[-1]
    assert asked.username == reader[0]
    # The registry's challenge names the actions in no fixed order ("pull,push" or "push,pull").
    [scope] = asked.scopes
    name, _, actions = scope.rpartition(":")
    assert (name, sorted(actions.split(","))) == (f"repository:{ns}/model", ["pull", "push"]), asked.scopes
    assert asked.granted == [{"type": "repository", "name": f"{ns}/model", "actions": ["pull"]}]


def test_tampered_token_is_refused(registry, space):
    ns, writer, reader = space
    registry.push_modelpack(f"{ns}/model", "v1", FILES, writer)
    url = f"/v2/{ns}/model/manifests/v1"
    token = registry.token(reader, [f"repository:{ns}/model:pull"])
    good = registry.request("GET", url, headers={"Authorization": f"Bearer {token}", "Accept": MANIFEST_ACCEPT})
    assert good.status_code == 200  # the token as issued works ...
    head, claims, signature = token.split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=="))
    raw[10] ^= 0x01
    forged = f"{head}.{claims}.{base64.urlsafe_b64encode(bytes(raw)).rstrip(b'=').decode()}"
    bad = registry.request("GET", url, headers={"Authorization": f"Bearer {forged}", "Accept": MANIFEST_ACCEPT})
    assert bad.status_code == 401  # ... one bit of its signature changed, it does not
    assert 'error="invalid_token"' in bad.headers["WWW-Authenticate"]


def test_modelpack_round_trip_and_ranges(registry, space):
    ns, writer, reader = space
    repository = f"{ns}/model"
    digest = registry.push_modelpack(repository, "v1", FILES, writer)
    body, media_type, served_digest = registry.get_manifest(repository, "v1", reader)
    assert media_type == OCI_MANIFEST
    assert served_digest == digest == sha256_digest(body)
    manifest = json.loads(body)
    assert manifest["artifactType"] == MODEL_ARTIFACT
    assert [(layer["mediaType"], layer["annotations"][TITLE], layer["annotations"][FILEPATH]) for layer in
            manifest["layers"]] == [(MODEL_WEIGHT_CONFIG, "config.json", "config.json"),
                                    (MODEL_WEIGHT, "model.safetensors", "model.safetensors")]  # fmt: skip
    # The same bytes by digest; a byte range of a layer.
    assert registry.get_manifest(repository, digest, reader)[0] == body
    weights = manifest["layers"][1]["digest"]
    part = registry.request("GET", f"/v2/{repository}/blobs/{weights}", reader, headers={"Range": "bytes=0-3"})
    assert part.status_code == 206
    assert part.content == FILES["model.safetensors"][:4]


def test_index_and_tag_moves(registry, space):
    ns, writer, reader = space
    repository = f"{ns}/model"
    first = registry.push_modelpack(repository, "v1", FILES, writer, filepath_annotation=False)
    second = registry.push_modelpack(repository, "v2", {"model.safetensors": b"other"}, writer)
    assert FILEPATH not in json.loads(registry.get_manifest(repository, first, reader)[0])["layers"][0]["annotations"]
    index = registry.push_index(repository, "all", [(first, None, None), (second, None, {"os": "linux"})], writer)
    body, media_type, digest = registry.get_manifest(repository, "all", reader)
    assert (media_type, digest) == (OCI_INDEX, index)
    assert [m["digest"] for m in json.loads(body)["manifests"]] == [first, second]
    assert registry.tag(repository, "v1", second, writer) == second
    assert registry.get_manifest(repository, "v1", reader)[2] == second


def test_wrong_password_is_refused_by_the_token_server(registry, space):
    ns, writer, _ = space
    response = _plain().get(
        registry.tokens.realm,
        params={"service": registry.tokens.service, "scope": f"repository:{ns}/model:pull"},
        auth=(writer[0], "wrong"),
    )
    assert response.status_code == 401
    assert "token" not in response.json()
    assert (registry.tokens.requests[-1].username, registry.tokens.requests[-1].status) == (writer[0], 401)
    with pytest.raises(RegistryError) as refused:
        registry.push_blob(f"{ns}/model", b"x", (writer[0], "wrong"))
    assert refused.value.response.status_code == 401
