"""OCI references on their own: what ``Reference.parse`` reads out of ``[registry/]repository[:tag][@digest]``
(Docker Hub's defaults included), what it refuses, the registry's base URL and back, and the schema's pattern
accepting exactly what the parser's grammar does."""

from __future__ import annotations

import re

import pytest

from gpustack_models.kinds.oci_reference import (
    _REFERENCE,
    DOCKER_HUB,
    OCI_REFERENCE_PATTERN,
    InvalidReference,
    Reference,
    endpoint,
    registry_of,
)
from gpustack_models.plugin.engine.ticket import OCI, HubSource

HEX = "0123456789abcdef" * 4
DIGEST = f"sha256:{HEX}"


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("registry.example:5000/ns/repo:v1.2", "registry.example:5000", "ns/repo", "v1.2", None),
        ("registry.example/team/sub/model", "registry.example", "team/sub/model", None, None),
        ("registry.example/a-b__c.d_e/f--g", "registry.example", "a-b__c.d_e/f--g", None, None),
        (f"registry.example/model@{DIGEST}", "registry.example", "model", None, DIGEST),
        (f"registry.example/model:v1@{DIGEST}", "registry.example", "model", "v1", DIGEST),
        ("nginx", DOCKER_HUB, "library/nginx", None, None),
        ("nginx:1.27", DOCKER_HUB, "library/nginx", "1.27", None),
        ("team/x", DOCKER_HUB, "team/x", None, None),
        ("team/x/y:v1", DOCKER_HUB, "team/x/y", "v1", None),
        ("docker.io/nginx", DOCKER_HUB, "library/nginx", None, None),
        ("docker.io/team/x", DOCKER_HUB, "team/x", None, None),
        ("localhost/x", "localhost", "x", None, None),
        ("localhost:5000/x:latest", "localhost:5000", "x", "latest", None),
        ("10.0.0.7:5000/models/x", "10.0.0.7:5000", "models/x", None, None),
    ],
)
def test_it_reads_the_registry_repository_tag_and_digest(text, registry, repository, tag, digest):
    assert Reference.parse(text) == Reference(registry, repository, tag, digest)


def test_a_digest_pins_the_reference_and_is_what_the_manifest_is_asked_for_by():
    tagged = Reference.parse("registry.example/model:v1")
    assert not tagged.pinned
    assert tagged.asked == "v1"
    both = Reference.parse(f"registry.example/model:v1@{DIGEST}")
    assert both.pinned
    assert both.asked == DIGEST  # the tag is only a label then
    assert Reference.parse(f"registry.example/model@{DIGEST}").asked == DIGEST


def test_a_reference_without_tag_or_digest_asks_for_latest():
    ref = Reference.parse("registry.example/model")
    assert (ref.tag, ref.digest, ref.pinned, ref.asked) == (None, None, False, "latest")


def test_a_tag_of_up_to_128_characters_is_taken():
    assert Reference.parse("model:" + "t" * 128).tag == "t" * 128


@pytest.mark.parametrize(
    "text",
    [
        "",
        "registry.example/Model",  # uppercase repository
        "Team/x",  # a Docker Hub path, uppercase
        "registry.example/model@sha256:" + HEX[:63],  # a digest that is not 64 hex
        "registry.example/model@sha256:" + HEX.upper(),
        "registry.example/model@sha512:" + HEX * 2,
        "registry.example/model@" + HEX,
        "model:" + "t" * 129,  # a tag longer than 128 characters
        "model:.hidden",
        "registry.example/a/../b",  # a path with '..'
        "registry.example/a..b",
        "../model",
        "registry.example/a//b",
        "/model",
        "model/",
        "registry.example/model:",
        "registry.example/-model",
        "registry.example:port/model",
        "model@",
        "https://registry.example/model",
        "registry.example/mo del",
        "a" * 256,  # a repository longer than 255 characters
    ],
)
def test_it_refuses_what_is_not_a_reference(text):
    with pytest.raises(InvalidReference):
        Reference.parse(text)


def test_its_refusal_is_a_value_error_quoting_the_text():
    with pytest.raises(ValueError, match="'registry.example/Model'"):
        Reference.parse("registry.example/Model")
    with pytest.raises(InvalidReference):
        Reference.parse(None)


@pytest.mark.parametrize("length", [240, 246, 247, 250, 255, 256])
def test_every_repository_it_accepts_is_one_a_ticket_accepts(length):
    """Docker Hub's ``library/`` counts towards the 255 characters a ticket allows."""
    try:
        ref = Reference.parse("a" * length)
    except InvalidReference:
        assert length + len("library/") > 255
        return
    HubSource(OCI, endpoint(ref.registry), ref.repository, DIGEST).check()


@pytest.mark.parametrize(
    ("registry", "insecure", "base"),
    [
        ("registry.example", (), "https://registry.example"),
        ("registry.example:5000", (), "https://registry.example:5000"),
        ("registry.example:5000", ("registry.example:5000",), "http://registry.example:5000"),
        ("registry.example:5000", ("registry.example",), "http://registry.example:5000"),  # the host alone
        ("registry.example:5000", ("registry.example:5001",), "https://registry.example:5000"),
        ("registry.example", ("other.example",), "https://registry.example"),
        ("localhost:5000", ["localhost"], "http://localhost:5000"),
        (DOCKER_HUB, (), "https://registry-1.docker.io"),
        (DOCKER_HUB, (DOCKER_HUB,), "https://registry-1.docker.io"),  # Docker Hub is never plain HTTP
    ],
)
def test_the_endpoint_is_https_unless_the_registry_is_listed_insecure(registry, insecure, base):
    assert endpoint(registry, insecure) == base


@pytest.mark.parametrize(
    "registry",
    ["registry.example", "registry.example:5000", "localhost", "localhost:5000", "10.0.0.7:5000", DOCKER_HUB],
)
@pytest.mark.parametrize("insecure", [(), ("registry.example", "localhost", "10.0.0.7")])
def test_registry_of_gives_back_the_registry_of_an_endpoint(registry, insecure):
    assert registry_of(endpoint(registry, insecure)) == registry


def test_registry_of_reads_a_base_url_with_a_path_and_any_case():
    assert registry_of("https://Registry.Example:5000/") == "registry.example:5000"
    assert registry_of("https://registry-1.docker.io/v2/") == DOCKER_HUB
    assert registry_of("http://localhost:5000") == "localhost:5000"


SAMPLES = [
    "nginx",
    "nginx:1.27",
    "team/x",
    "localhost/x",
    "localhost:5000/x:v1",
    "registry.example:5000/ns/repo:tag",
    f"registry.example/model@{DIGEST}",
    f"registry.example/model:v1@{DIGEST}",
    "a-b.c_d/e__f",
    "Registry.Example/model",
    "model:" + "t" * 128,
    "model:" + "t" * 129,
    "registry.example/Model",
    "registry.example/a/../b",
    "registry.example/a..b",
    f"registry.example/model@sha256:{HEX[:63]}",
    f"registry.example/model@sha256:{HEX.upper()}",
    "registry.example/model:",
    "registry.example:port/model",
    "https://registry.example/model",
    "/model",
    "model/",
    "",
    " nginx",
    "nginx\n",
    "model:v1:v2",
    "model@@" + DIGEST,
]


@pytest.mark.parametrize("text", SAMPLES)
def test_the_schemas_pattern_matches_exactly_what_the_grammar_matches(text):
    assert bool(re.fullmatch(OCI_REFERENCE_PATTERN, text)) == bool(_REFERENCE.fullmatch(text))


def test_the_schemas_pattern_has_no_named_groups_and_accepts_and_refuses_samples():
    assert "?P<" not in OCI_REFERENCE_PATTERN
    assert re.compile(OCI_REFERENCE_PATTERN).groupindex == {}
    accepted = {text for text in SAMPLES if re.fullmatch(OCI_REFERENCE_PATTERN, text)}
    assert "registry.example:5000/ns/repo:tag" in accepted
    assert "registry.example/Model" not in accepted  # the samples do test both sides
