"""The sources a fetch ticket offers, and their order: public sources (the asking node's tenants' first), then
the node's tenants' tokens, never another tenant's token; each once; a Secret without a usable token leaves
its source token-less."""

import base64
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from gpustack_models import kube
from gpustack_models.internal import tickets

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def row(namespace, name, repository="org/model", secret="", minutes_ago=0):
    return SimpleNamespace(
        artifact=SimpleNamespace(namespace=namespace, name=name),
        source="huggingFace",
        endpoint="https://hub.example",
        repository=repository,
        commit="c" * 40,
        secret_name=secret,
        resolved_at=NOW - timedelta(minutes=minutes_ago),
    )


def names(rows):
    return [f"{r.artifact.namespace}/{r.artifact.name}" for r in rows]


def test_it_offers_public_sources_then_the_nodes_tenants_tokens_and_no_other_tenants_token():
    rows = [
        row("attacker", "bait", secret="aaa", minutes_ago=0),  # named to sort first, the newest
        row("other", "borrowed", secret="hub-token", minutes_ago=5),
        row("public", "old", minutes_ago=30),
        row("public", "new", minutes_ago=1),
        row("victim", "tokened", secret="victim-token", minutes_ago=2),
        row("victim", "plain", minutes_ago=60),
        row("neighbour", "tokened", secret="their-token", minutes_ago=3),
    ]
    ordered = tickets.ordered(rows, wanting={"victim", "neighbour"})
    assert names(ordered) == [
        "victim/plain",  # token-less: the node's tenants first
        "public/new",  # then the other public sources, the most recently resolved first
        "public/old",
        "victim/tokened",  # the node's tenants' tokens, the most recently resolved first
        "neighbour/tokened",
    ]  # and no token of a tenant that places nothing on the node: attacker/bait, other/borrowed
    assert names(tickets.ordered(rows, wanting=set())) == ["public/new", "public/old", "victim/plain"]


def test_it_offers_each_source_once_with_its_secrets_token(monkeypatch):
    reads = []
    tokens = {("victim", "victim-token"): "hf_victim", ("attacker", "aaa"): None}  # the attacker's: unusable

    def hub_token(namespace, name):
        reads.append((namespace, name))
        return tokens[(namespace, name)]

    monkeypatch.setattr(tickets, "hub_token", hub_token)
    rows = [
        row("victim", "a", secret="victim-token"),
        row("victim", "b", secret="victim-token"),  # the same source and token: once
        row("public", "c"),
        row("attacker", "d", secret="aaa"),  # no usable token: the same as the public one
        row("public", "e", repository="org/other"),
    ]
    offered = tickets.offered_sources(rows)
    assert [(s["repository"], s["token"]) for s in offered] == [
        ("org/model", "hf_victim"),
        ("org/model", None),
        ("org/other", None),
    ]
    assert reads == [("victim", "victim-token"), ("attacker", "aaa")]  # each Secret read once
    assert set(offered[0]) == {"source", "endpoint", "repository", "commit", "token"}


class Secrets:
    def __init__(self, tokens):
        self.tokens = tokens

    def get(self, path):
        name = path.rsplit("/", 1)[-1]
        if name not in self.tokens:
            raise kube.NotFound(f"secrets {name!r} not found")
        return {"data": {"token": self.tokens[name]}}


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    ("stored", "token"),
    [
        (b64(b"hf_good\n"), "hf_good"),
        (b64(b"two\nlines"), None),
        (b64(b"with space"), None),
        (b64(b"   "), None),
        (b64(b"\xff\xfe"), None),
        ("not base64!", None),
        ("", None),
    ],
    ids=["trailing-newline", "two-lines", "space", "blank", "not-utf8", "not-base64", "empty"],
)
def test_it_offers_only_a_token_a_plugin_accepts(monkeypatch, stored, token):
    monkeypatch.setattr(kube, "default", lambda: Secrets({"hub-token": stored}))
    assert tickets.hub_token("ns", "hub-token") == token
    assert tickets.hub_token("ns", "missing") is None
