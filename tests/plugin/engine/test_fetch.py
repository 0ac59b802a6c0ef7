"""A ticket's several sources: the next one takes over when one fails, a failed one is tried last for a
while, and the ticket carries them all (tokens redacted, each source checked)."""

from __future__ import annotations

import dataclasses

import pytest

from gpustack_models.plugin.engine import FAILED, READY, DownloadFailed, FetchTicket, HubSource, SourcePenalties
from gpustack_models.sources.manifest import manifest_digest
from tests.plugin.conftest import Clock, KiB, MiB, random_bytes, settings, ticket_for

FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model-00001.safetensors": random_bytes(1 * MiB + 77, seed=21),
    "model-00002.safetensors": random_bytes(300 * KiB, seed=22),
    "tokenizer.json": random_bytes(5 * KiB, seed=23),
}


def hub_gets(hub, repo):
    """The GETs of ``repo``'s files on the hub (redirects to the CDN included), in arrival order."""
    return [r for r in hub.requests if r.listener == "hub" and r.method == "GET" and f"/{repo}/resolve/" in r.path]


def with_fallbacks(ticket: FetchTicket, *fallbacks: HubSource) -> FetchTicket:
    return dataclasses.replace(ticket, fallbacks=fallbacks)


def source_of(hub, repo, commit, token=None) -> HubSource:
    return HubSource("huggingFace", hub.url, repo, commit, token)


@pytest.fixture
def copies(fakehub):
    """The same files in a repository gone private (the ticket has no token for it) and a public one."""
    gone = fakehub.add_hf_repo("evil/copy", FILES)
    fakehub.set_private("evil/copy")
    public = fakehub.add_hf_repo("org/model", FILES)
    return gone, public


def test_it_falls_through_to_the_next_source_and_skips_the_failed_one_for_later_files(fakehub, make_engine, copies):
    gone, public = copies
    ticket = with_fallbacks(ticket_for(fakehub, "evil/copy", gone), source_of(fakehub, "org/model", public))
    engine = make_engine(concurrency=1)  # one part at a time: the files after the first never try the copy

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == READY, entry
    assert (engine.path(ticket.digest) / "model-00001.safetensors").read_bytes() == FILES["model-00001.safetensors"]
    assert [r.status for r in hub_gets(fakehub, "evil/copy")] == [401]
    assert {r.path.rsplit("/", 1)[-1] for r in hub_gets(fakehub, "org/model")} == set(FILES)
    assert engine.penalties.penalized(ticket.primary.key)
    assert not engine.penalties.penalized(ticket.fallbacks[0].key)


def test_it_keeps_the_bytes_a_failing_source_wrote(fakehub, make_engine):
    fakehub.lfs_threshold = 64 * MiB  # every file from the hub itself: faults can tell the repositories apart
    data = random_bytes(3 * MiB, seed=24)
    flaky = fakehub.add_hf_repo("org/flaky", {"model.safetensors": data})
    steady = fakehub.add_hf_repo("org/steady", {"model.safetensors": data})
    fakehub.faults.drop("/org/flaky/", after_bytes=300 * KiB, times=None)  # 300 KiB per request, then a drop
    ticket = with_fallbacks(ticket_for(fakehub, "org/flaky", flaky), source_of(fakehub, "org/steady", steady))
    engine = make_engine(settings=settings(split_threshold=64 * MiB, range_retries=3))  # one range per file

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == READY, entry
    assert (engine.path(ticket.digest) / "model.safetensors").read_bytes() == data
    assert len(hub_gets(fakehub, "org/flaky")) == 4  # the first request and its 3 retries
    (taken_over,) = hub_gets(fakehub, "org/steady")
    start = int(taken_over.range.split("=")[1].split("-")[0])
    assert start >= 4 * 300 * KiB - 64 * KiB  # from where the failing source stopped, not from the start
    assert engine.stats(ticket.digest)["network_bytes"] == len(data)  # no byte fetched twice


def test_it_fails_only_when_every_source_failed(fakehub, make_engine, clock, copies):
    gone, public = copies
    fakehub.faults.fail("/org/model/", 503, times=None)
    ticket = with_fallbacks(ticket_for(fakehub, "evil/copy", gone), source_of(fakehub, "org/model", public))
    engine = make_engine(clock=clock)

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    # The reason is the failure of whichever source a part tried first: parts run in parallel, and once the
    # gone copy failed a later part tries it last, so either source's reason may come first.
    assert entry.state == FAILED and entry.reason in ("AccessDenied", "SourceUnavailable"), entry
    assert ("HTTP 401" in entry.message or "HTTP 503" in entry.message) and "all 2 sources failed" in entry.message
    assert "evil/copy" not in entry.message and "org/model" not in entry.message
    assert entry.retry_time == clock.now + 60  # one failure of the attempt, one backoff
    assert hub_gets(fakehub, "org/model"), "the second source was never tried"


def test_it_tries_a_failed_source_last_for_a_while_in_later_downloads(fakehub, make_engine, copies):
    gone, public = copies
    penalty_clock = Clock()
    engine = make_engine(concurrency=1, penalties=SourcePenalties(seconds=300, clock=penalty_clock))

    def subset(*paths):  # another digest from the same sources: a selection of their files
        full = with_fallbacks(ticket_for(fakehub, "evil/copy", gone), source_of(fakehub, "org/model", public))
        files = [f for f in full.files if f.path in paths]
        return dataclasses.replace(full, digest=manifest_digest(files), files=files)

    for paths in (("config.json",), ("tokenizer.json",), ("model-00002.safetensors",)):
        ticket = subset(*paths)
        engine.ensure(ticket)
        assert engine.wait(ticket.digest, timeout=30).state == READY
        if paths == ("tokenizer.json",):
            penalty_clock.advance(301)  # a few minutes later, the copy is tried first again
    statuses = [r.status for r in hub_gets(fakehub, "evil/copy")]
    assert statuses == [401, 401]  # the first and the third download, not the second


def test_it_carries_every_source_on_the_wire_with_the_first_at_the_top_level(fakehub, copies):
    gone, public = copies
    first = ticket_for(fakehub, "evil/copy", gone, token="hf_first_token")
    ticket = with_fallbacks(first, source_of(fakehub, "org/model", public, "hf_second_token"))

    secret = ticket.to_dict(include_token=True)
    assert (secret["repository"], secret["commit"], secret["token"]) == ("evil/copy", gone, "hf_first_token")
    assert [s["token"] for s in secret["sources"]] == ["hf_first_token", "hf_second_token"]
    assert FetchTicket.from_dict(secret).sources == ticket.sources
    public_form = ticket.to_dict()
    assert "token" not in public_form and all("token" not in s for s in public_form["sources"])
    single = {k: v for k, v in secret.items() if k != "sources"}  # what a worker without sources sends
    assert FetchTicket.from_dict(single).sources == (first.primary,)
    for text in (repr(ticket), str(ticket), repr(ticket.sources), repr(ticket.fallbacks[0])):
        assert "hf_first_token" not in text and "hf_second_token" not in text


def test_it_offers_a_source_once(fakehub, copies):
    gone, public = copies
    first = ticket_for(fakehub, "org/model", public)
    ticket = with_fallbacks(
        first,
        source_of(fakehub, "org/model", public),
        source_of(fakehub, "org/model", public, "hf_token"),
        source_of(fakehub, "org/model", public),
    )
    assert [s.token for s in ticket.sources] == [None, "hf_token"]


@pytest.mark.parametrize(
    "change",
    [
        {"token": "two\nlines"},
        {"token": "with space"},
        {"token": ""},
        {"repository": "org/../etc"},
        {"commit": "main;rm"},
        {"endpoint": "ftp://hub"},
        {"source": "gitHub"},
    ],
    ids=["newline-token", "spaced-token", "empty-token", "dotted-repository", "bad-commit", "bad-endpoint", "kind"],
)
def test_it_checks_every_source_as_strictly_as_the_first(fakehub, copies, change):
    gone, public = copies
    ticket = ticket_for(fakehub, "org/model", public)
    bad = dataclasses.replace(source_of(fakehub, "org/model", public), **change)
    with pytest.raises(DownloadFailed) as caught:
        with_fallbacks(ticket, bad).validate()
    assert caught.value.reason == "InvalidRequest"
    assert "two\nlines" not in caught.value.message and "with space" not in caught.value.message
    ticket.validate()
    with_fallbacks(ticket, source_of(fakehub, "evil/copy", gone, "hf_token")).validate()
