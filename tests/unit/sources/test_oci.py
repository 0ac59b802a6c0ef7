"""The OCI source without a registry: credentials read from a ``.dockerconfigjson`` (and never shown), where
they may go, the platform picked from an index, and an artifact manifest's layers read as files."""

from __future__ import annotations

import base64

import pytest

from gpustack_models.sources.hub_errors import InvalidManifest, RevisionNotFound
from gpustack_models.sources.manifest import ManifestFile
from gpustack_models.sources.oci import (
    FILEPATH,
    MODELPACK_ARTIFACT,
    TITLE,
    Credentials,
    credentials_for,
    credentials_may_go,
    is_image,
    pick_platform,
)
from gpustack_models.sources.oci import artifact_files as _artifact_files

A, B, C = "a" * 64, "b" * 64, "c" * 64
SAID = "registry.example/model:v1"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"


def auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def config(key: str, **entry) -> dict:
    return {"auths": {key: entry}}


# ---------------------------------------------------------------- credentials


@pytest.mark.parametrize(
    ("key", "registry"),
    [
        ("registry.example:5000", "registry.example:5000"),
        ("https://registry.example:5000/v1/", "registry.example:5000"),
        ("http://registry.example", "registry.example"),
        ("Registry.Example", "registry.example"),
        ("registry.example", "Registry.Example"),
        ("https://index.docker.io/v1/", "docker.io"),
        ("index.docker.io", "docker.io"),
        ("registry-1.docker.io", "docker.io"),
        ("docker.io", "docker.io"),
    ],
)
def test_it_finds_a_registrys_credentials_by_any_spelling_of_its_key(key, registry):
    assert credentials_for(config(key, auth=auth("u", "p:w")), registry) == Credentials("u", "p:w")


def test_it_reads_username_and_password_when_there_is_no_auth():
    found = credentials_for(config("registry.example", username="u", password="pw"), "registry.example")
    assert found == Credentials("u", "pw")
    assert found.basic == auth("u", "pw")


def test_auth_wins_over_username_and_password():
    entry = {"auth": auth("from-auth", "1"), "username": "from-fields", "password": "2"}
    assert credentials_for(config("registry.example", **entry), "registry.example") == Credentials("from-auth", "1")


def test_it_finds_the_entry_of_the_registry_among_others():
    cfg = {"auths": {"other.example": {"auth": auth("o", "1")}, "registry.example": {"auth": auth("r", "2")}}}
    assert credentials_for(cfg, "registry.example") == Credentials("r", "2")


@pytest.mark.parametrize(
    ("cfg", "registry"),
    [
        (config("other.example", auth=auth("u", "p")), "registry.example"),
        (config("registry.example:5000", auth=auth("u", "p")), "registry.example"),  # another port
        (config("registry.example", auth=auth("u", "p")), "registry.example:5000"),
        (config("registry.example"), "registry.example"),  # an entry with nothing in it
        ({"auths": {}}, "registry.example"),
    ],
)
def test_it_finds_none_when_no_entry_names_the_registry(cfg, registry):
    assert credentials_for(cfg, registry) is None


@pytest.mark.parametrize("bad", ["not base64!", auth("u", "p") + "x", base64.b64encode(b"no-colon").decode(), "é"])
def test_a_malformed_auth_is_a_value_error_naming_its_key(bad):
    with pytest.raises(ValueError, match="'registry.example'"):
        credentials_for(config("registry.example", auth=bad), "registry.example")


@pytest.mark.parametrize("cfg", [{}, {"auths": []}, {"auths": None}, {"credHelpers": {}}, [], None])
def test_a_config_without_auths_is_a_value_error(cfg):
    with pytest.raises(ValueError, match="'auths'"):
        credentials_for(cfg, "registry.example")


@pytest.mark.parametrize("bad", [12345, ["x"], {"a": "b"}])
def test_an_auth_that_is_not_a_string_is_a_value_error(bad):
    with pytest.raises(ValueError):
        credentials_for(config("registry.example", auth=bad), "registry.example")


def test_index_docker_io_finds_the_docker_hub_credentials():
    found = credentials_for(config("https://index.docker.io/v1/", auth=auth("u", "p")), "index.docker.io")
    assert found == Credentials("u", "p")


def test_credentials_never_show_their_password():
    creds = Credentials("robot", "s3cr3t-pw")
    for text in (repr(creds), str(creds), f"{creds}", repr([creds]), repr({"c": creds})):
        assert "s3cr3t-pw" not in text
        assert "robot" in text
    assert "<redacted>" in repr(creds)


@pytest.mark.parametrize(
    ("realm", "base", "may"),
    [
        ("https://auth.example/token", "https://registry.example", True),
        ("https://auth.example/token", "http://registry.example:5000", True),  # HTTPS goes anywhere
        ("http://registry.example:5001/token", "http://registry.example:5000", True),  # the registry's host
        ("http://Registry.Example/token", "http://registry.example:5000", True),
        ("http://auth.example/token", "http://registry.example:5000", False),  # plain HTTP elsewhere
        ("http://auth.example/token", "https://registry.example", False),
        ("ftp://registry.example/token", "http://registry.example", True),  # scheme checked by the caller
        ("", "https://registry.example", False),
    ],
)
def test_credentials_go_over_https_or_to_the_registrys_own_host(realm, base, may):
    assert credentials_may_go(realm, base) is may


# ---------------------------------------------------------------- platforms


def entry(digest: str, platform: str | None = None) -> dict:
    out = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{digest}", "size": 1}
    if platform:
        out["platform"] = dict(zip(("os", "architecture", "variant"), platform.split("/")))
    return out


INDEX = {"manifests": [entry(A, "linux/arm64/v8"), entry(B, "linux/amd64"), entry(C, "windows/amd64")]}


@pytest.mark.parametrize(
    ("platform", "digest"),
    [("linux/amd64", B), ("linux/arm64/v8", A), ("linux/arm64", A), ("windows/amd64", C)],
)
def test_it_picks_the_manifest_of_the_platform(platform, digest):
    assert pick_platform(INDEX, platform, SAID) == f"sha256:{digest}"


def test_it_takes_the_only_manifest_of_an_index_that_names_no_platform():
    assert pick_platform({"manifests": [entry(A)]}, "linux/amd64", SAID) == f"sha256:{A}"
    assert pick_platform({"manifests": [dict(entry(A), platform={})]}, "linux/amd64", SAID) == f"sha256:{A}"


@pytest.mark.parametrize(
    ("index", "offered"),
    [
        (INDEX, "linux/amd64, linux/arm64/v8, windows/amd64"),
        ({"manifests": [entry(A), entry(B)]}, "none"),
        ({"manifests": []}, "none"),
        ({}, "none"),
    ],
)
def test_no_manifest_for_the_platform_names_what_the_index_has(index, offered):
    with pytest.raises(RevisionNotFound) as caught:
        pick_platform(index, "linux/s390x" if index is INDEX else "linux/amd64", SAID)
    assert f"(it has: {offered})" in str(caught.value)
    assert SAID in str(caught.value)


# ---------------------------------------------------------------- files


def layer(
    name: str | None, digest: str = f"sha256:{A}", size: int = 7, *, key: str = TITLE, media_type: str = WEIGHT
) -> dict:
    return {"mediaType": media_type, "digest": digest, "size": size, "annotations": {key: name} if name else {}}


def manifest(*layers: dict, **fields) -> dict:
    base = {"artifactType": MODELPACK_ARTIFACT, "config": {"mediaType": "application/vnd.cncf.model.config.v1+json"}}
    return base | {"layers": list(layers)} | fields


def artifact_files(m: dict, path: str | None = None) -> list[ManifestFile]:
    return _artifact_files(m, path, SAID)


def test_each_layer_is_a_file_named_by_its_filepath_rather_than_its_title():
    named = layer("weights.bin", f"sha256:{A}", 7) | {"annotations": {TITLE: "weights.bin", FILEPATH: "sub/w.bin"}}
    files = artifact_files(manifest(named, layer("config.json", f"sha256:{B}", 2, key=FILEPATH)))
    assert files == [ManifestFile("sub/w.bin", 7, "sha256", A), ManifestFile("config.json", 2, "sha256", B)]


def test_a_title_alone_names_the_file():
    files = artifact_files(manifest(layer("tokenizer/vocab.txt", f"sha256:{C}", 0)))
    assert files == [ManifestFile("tokenizer/vocab.txt", 0, "sha256", C)]


@pytest.mark.parametrize("path", ["sub", "sub/", "/sub/"])
def test_a_path_keeps_the_files_under_it_named_relative_to_it(path):
    layers = [layer("sub/a.bin", f"sha256:{A}"), layer("sub/deeper/b.bin", f"sha256:{B}"), layer("subway.bin")]
    files = artifact_files(manifest(*layers, layer("other/c.bin", f"sha256:{C}")), path)
    assert [f.path for f in files] == ["a.bin", "deeper/b.bin"]
    assert [f.hexdigest for f in files] == [A, B]


def test_no_path_or_an_empty_one_keeps_every_file():
    m = manifest(layer("a.bin", f"sha256:{A}"), layer("sub/b.bin", f"sha256:{B}"))
    assert [f.path for f in artifact_files(m)] == [f.path for f in artifact_files(m, "/")] == ["a.bin", "sub/b.bin"]


def test_an_image_config_with_an_artifact_type_is_an_artifact():
    m = manifest(layer("a.bin", f"sha256:{A}"), config={"mediaType": "application/vnd.oci.image.config.v1+json"})
    assert [f.path for f in artifact_files(m)] == ["a.bin"]


@pytest.mark.parametrize(
    ("m", "says"),
    [
        (manifest(layer(None, f"sha256:{A}")), "has no org.opencontainers.image.title"),
        (manifest(layer("w.tar", f"sha256:{A}", media_type="application/vnd.oci.image.layer.v1.tar")), "archive"),
        (manifest(layer("w", f"sha256:{A}", media_type="application/vnd.oci.image.layer.v1.tar+gzip")), "archive"),
        (manifest(layer("w", f"sha256:{A}", media_type="application/vnd.cncf.model.weight.v1.tar+zstd")), "archive"),
        (manifest(layer("a.bin", f"sha512:{A}{A}")), "sha256 digest"),
        (manifest(layer("a.bin", A)), "sha256 digest"),
        (manifest(layer("a.bin", f"sha256:{A.upper()}")), "sha256 digest"),
        (manifest(layer("../escape.bin", f"sha256:{A}")), "'..'"),
        (manifest(layer("sub/../../escape.bin", f"sha256:{A}")), "'..'"),
        (manifest(layer("a.bin", f"sha256:{A}", -1)), "size"),
        (manifest(layer("a.bin", f"sha256:{A}") | {"size": None}), "a.bin"),
    ],
)
def test_it_refuses_layers_that_are_not_files_it_can_fetch(m, says):
    with pytest.raises(InvalidManifest, match=SAID) as caught:
        artifact_files(m)
    assert says in str(caught.value)


def test_a_title_with_dot_dot_under_a_path_is_refused_too():
    with pytest.raises(InvalidManifest, match="'..'"):
        artifact_files(manifest(layer("sub/../../escape.bin", f"sha256:{A}")), "sub")


@pytest.mark.parametrize(
    "config", ["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"]
)
def test_a_container_image_is_not_read_as_an_artifact(config):
    """An image's files are those of its flattened layers (``image_files``), not one per layer."""
    image = manifest(layer("a.bin", f"sha256:{A}"), config={"mediaType": config})
    del image["artifactType"]
    assert is_image(image)
    with pytest.raises(InvalidManifest, match="is a container image, not an artifact"):
        artifact_files(image)


@pytest.mark.parametrize(
    ("m", "path"),
    [
        (manifest("not-an-object"), None),
        (manifest(layer("a.bin", f"sha256:{A}") | {"annotations": {TITLE: 5}}), "sub"),
        (manifest(layer("a.bin", f"sha256:{A}") | {"annotations": ["x"]}), None),
        (manifest(config="not-an-object"), None),
    ],
)
def test_a_malformed_manifest_is_an_invalid_manifest(m, path):
    with pytest.raises(InvalidManifest):
        artifact_files(m, path)
