"""The engine the plugin's glue drives: backoff, capacity, limits, collection, restarts, metrics."""

from __future__ import annotations

import os
import threading

import pytest
from prometheus_client import generate_latest

from gpustack_models.plugin.engine import DOWNLOADING, FAILED, READY, Metrics
from gpustack_models.plugin.engine.cache import read_json
from gpustack_models.plugin.engine.records import rfc3339
from tests.plugin.conftest import (
    InFlight,
    KiB,
    ManualClock,
    MiB,
    random_bytes,
    settings,
    ticket_for,
    tree_files,
    wait_for,
)


@pytest.mark.parametrize("status", [503, 429])
def test_it_reports_source_unavailable_with_a_retry_time_that_survives_a_restart(fakehub, make_engine, clock, status):
    data = random_bytes(1 * MiB, seed=11)
    commit = fakehub.add_hf_repo("org/flaky", {"config.json": b"{}", "model.safetensors": data})
    fakehub.faults.fail("model.safetensors", status, times=None, retry_after=5 if status == 429 else None)
    ticket = ticket_for(fakehub, "org/flaky", commit)
    engine = make_engine(clock=clock)

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)
    assert entry.state == FAILED and entry.reason == "SourceUnavailable", entry
    assert f"HTTP {status}" in entry.message and "org/flaky" not in entry.message
    assert entry.retry_time == clock.now + 60
    assert entry.status()["retryTime"].endswith("Z")

    # A second failure doubles the wait.
    clock.advance(60)
    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).retry_time == clock.now + 120
    retry_time = clock.now + 120
    engine.close()

    # A restarted engine knows the failure and does not try before retryTime, even when asked.
    restarted = make_engine(clock=clock)
    entry = restarted.entry(ticket.digest)
    assert entry.state == FAILED and entry.reason == "SourceUnavailable" and entry.retry_time == retry_time
    before = len(fakehub.requests)
    clock.advance(100)
    assert restarted.ensure(ticket).state == FAILED
    assert restarted.wait(ticket.digest, timeout=30).state == FAILED  # nothing was started behind it
    assert len(fakehub.requests) == before

    # After retryTime a download starts again; success resets the count.
    fakehub.faults.clear()
    clock.advance(21)
    restarted.ensure(ticket)
    entry = restarted.wait(ticket.digest, timeout=30)
    assert entry.state == READY and entry.retry_time is None and entry.reason is None
    assert read_json(restarted.cache.record_path(ticket.digest))["failures"] == 0
    assert (restarted.path(ticket.digest) / "model.safetensors").read_bytes() == data


def test_it_starts_before_retry_time_only_when_forced(fakehub, make_engine, clock):
    commit = fakehub.add_hf_repo("org/force", {"config.json": b"{}"})
    fakehub.faults.fail("config.json", 500, times=1)
    ticket = ticket_for(fakehub, "org/force", commit)
    engine = make_engine(clock=clock)
    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).state == FAILED

    before = len(fakehub.requests)
    assert engine.ensure(ticket).state == FAILED
    assert engine.wait(ticket.digest, timeout=30).state == FAILED  # nothing was started behind it
    assert len(fakehub.requests) == before
    engine.ensure(ticket, force=True)
    assert engine.wait(ticket.digest, timeout=30).state == READY


def test_it_refuses_a_download_the_watermark_cannot_hold(fakehub, make_engine):
    commit = fakehub.add_hf_repo("org/huge", {"model.safetensors": random_bytes(3 * MiB, seed=12)})
    ticket = ticket_for(fakehub, "org/huge", commit)
    # A 10 MiB volume with its high watermark at 25 %: 2.5 MiB may be used.
    engine = make_engine(capacity_bytes=10 * MiB, high_percent=25, low_percent=20)

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == FAILED and entry.reason == "InsufficientCapacity", entry
    assert not fakehub.requests
    assert engine.capacity() == {"totalBytes": 10 * MiB, "storedBytes": 0, "usedPercent": 0}

    engine.set_watermarks(80, 70)
    engine.ensure(ticket, force=True)
    assert engine.wait(ticket.digest, timeout=30).state == READY
    assert engine.capacity() == {"totalBytes": 10 * MiB, "storedBytes": 3 * MiB, "usedPercent": 30}


def test_it_counts_running_downloads_against_the_watermark(fakehub, make_engine):
    first = fakehub.add_hf_repo("org/one", {"model.safetensors": random_bytes(3 * MiB, seed=13)})
    second = fakehub.add_hf_repo("org/two", {"model.safetensors": random_bytes(3 * MiB, seed=14)})
    fakehub.faults.throttle("model.safetensors", 1 * MiB, listener="cdn")
    one, two = ticket_for(fakehub, "org/one", first), ticket_for(fakehub, "org/two", second)
    engine = make_engine(capacity_bytes=10 * MiB, high_percent=50, low_percent=40)  # 5 MiB

    engine.ensure(one)
    wait_for(lambda: engine.running() and engine.running()[0]["downloadedBytes"] > 0)
    engine.ensure(two)  # 3 MiB reserved by the first + 3 MiB > 5 MiB
    entry = engine.wait(two.digest, timeout=30)

    assert entry.state == FAILED and entry.reason == "InsufficientCapacity"
    assert "reserved by other downloads" in entry.message
    assert engine.wait(one.digest, timeout=30).state == READY


class SharedClock(ManualClock):
    """A ManualClock for a rate limiter that several threads share. Each thread sleeps from the time it
    last read, and the clock is the latest time any thread slept until: the limiter lays its grants end
    to end, so the clock ends at the time the last bytes were granted, however the threads interleave."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._read = threading.local()

    def __call__(self) -> float:
        with self._lock:
            self._read.at = self.now
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept += 1
            self._read.at += seconds
            self.now = max(self.now, self._read.at)


class HeldClock(SharedClock):
    """A SharedClock whose sleeps wait for the test: a read that must wait for its turn at the rate is held
    until ``release()``; ``end()`` says the download is over."""

    def __init__(self):
        super().__init__()
        self._cond = threading.Condition()
        self._held = 0
        self._round = 0
        self._ended = False

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        with self._cond:
            self._held += 1
            mine = self._round
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._round > mine, timeout=10)

    def wait_held(self, timeout: float = 10) -> bool:
        """True once a read is held, False once the download ended with none held."""
        with self._cond:
            assert self._cond.wait_for(lambda: self._held or self._ended, timeout), "no read held, nor an end"
            return bool(self._held)

    def release(self) -> None:
        with self._cond:
            self._held = 0
            self._round += 1
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()


def test_it_holds_the_node_rate_limit(fakehub, make_engine):
    first = fakehub.add_hf_repo("org/r1", {"model.safetensors": random_bytes(4 * MiB, seed=15)})
    second = fakehub.add_hf_repo("org/r2", {"model.safetensors": random_bytes(2 * MiB, seed=16)})
    tickets = [ticket_for(fakehub, "org/r1", first), ticket_for(fakehub, "org/r2", second)]
    rate, burst = 2 * MiB, 0.05  # the limiter's burst allowance
    largest = settings().buffer_size  # no read asks for more at once
    clock = SharedClock()
    engine = make_engine(concurrency=6, bytes_per_second=rate, rate_clock=clock, rate_sleep=clock.sleep)

    for ticket in tickets:  # two downloads at once share the node's rate
        engine.ensure(ticket)
    for ticket in tickets:
        assert engine.wait(ticket.digest, timeout=30).state == READY

    read = sum(engine.stats(ticket.digest)["network_bytes"] for ticket in tickets)
    assert read >= 6 * MiB and clock.slept > 0
    # The limiter's clock ends when the last read was granted: every byte read before it had its time at
    # the node's rate (less the burst allowance), so the node was never faster than the rate; and no later
    # than that, so it was not slower either (the limiter grants at the rate).
    elapsed = clock.now - 1000.0
    assert (read - largest) / rate - burst <= elapsed + 1e-9, (elapsed, read)
    assert elapsed <= read / rate - burst + 1e-9, (elapsed, read)


def test_it_changes_the_rate_limit_while_downloading(fakehub, make_engine):
    commit = fakehub.add_hf_repo("org/slow", {"model.safetensors": random_bytes(4 * MiB, seed=17)})
    ticket = ticket_for(fakehub, "org/slow", commit)
    # At 64 KiB/s the download would take a minute: finishing within the wait below shows the
    # change took effect (the wait is a deadline with a wide margin, not a measure of speed).
    engine = make_engine(concurrency=2, bytes_per_second=64 * 1024)
    engine.ensure(ticket)
    wait_for(lambda: engine.running() and engine.running()[0]["downloadedBytes"] > 0)

    engine.set_limits(concurrency=8, bytes_per_second=0)
    assert engine.wait(ticket.digest, timeout=30).state == READY


def test_it_never_exceeds_the_node_concurrency(fakehub, make_engine):
    repos = {}
    for n in range(2):
        files = {f"shard-{i}.safetensors": random_bytes(384 * 1024, seed=100 * n + i) for i in range(4)}
        files["big.safetensors"] = random_bytes(2 * MiB, seed=100 * n + 50)
        repos[f"org/c{n}"] = fakehub.add_hf_repo(f"org/c{n}", files)
    fakehub.faults.throttle(".safetensors", 2 * MiB, listener="cdn")  # each request lasts a while
    tickets = [ticket_for(fakehub, repo, commit) for repo, commit in repos.items()]
    in_flight = InFlight(fakehub)
    engine = make_engine(concurrency=3)

    for ticket in tickets:  # two downloads share the node's three connections
        engine.ensure(ticket)
    for ticket in tickets:
        assert engine.wait(ticket.digest, timeout=30).state == READY

    assert in_flight.peak == 3
    assert engine.limits.slots.peak == 3


def test_it_reports_progress_while_downloading(fakehub, make_engine):
    data = random_bytes(3 * MiB, seed=18)
    commit = fakehub.add_hf_repo("org/progress", {"model.safetensors": data})
    ticket = ticket_for(fakehub, "org/progress", commit)
    events = []
    clock = HeldClock()  # the download's reads wait at the node's rate until the test lets them go

    def changed(digest, entry):
        events.append((digest, entry.state))
        if entry.state != DOWNLOADING:
            clock.end()

    engine = make_engine(bytes_per_second=3 * MiB, on_change=changed, rate_clock=clock, rate_sleep=clock.sleep)

    engine.ensure(ticket)
    seen = []
    while clock.wait_held():  # reads are held mid-download: what does it report?
        running = engine.running()
        assert running and running[0]["digest"] == ticket.digest and running[0]["sizeBytes"] == len(data)
        assert running[0]["source"] == "Hub"
        seen.append(running[0]["downloadedBytes"])
        clock.release()
    assert len(seen) > 2, seen
    # Bytes grow and are seen part-way, never past the size.
    assert seen == sorted(seen) and any(0 < s < len(data) for s in seen) and max(seen) < len(data)
    assert engine.wait(ticket.digest, timeout=30).state == READY
    assert events == [(ticket.digest, DOWNLOADING), (ticket.digest, READY)]
    status = engine.entry(ticket.digest).status()
    assert set(status) == {"digest", "state", "sizeBytes", "downloadedBytes", "lastUsedTime", "source"}


def test_it_cancels_a_download_and_resumes_it_later(fakehub, make_engine, clock):
    data = random_bytes(3 * MiB, seed=19)
    commit = fakehub.add_hf_repo("org/cancel", {"model.safetensors": data})
    fakehub.faults.throttle("model.safetensors", 1 * MiB, listener="cdn")
    ticket = ticket_for(fakehub, "org/cancel", commit)
    engine = make_engine(clock=clock)

    engine.ensure(ticket)
    wait_for(lambda: engine.running() and engine.running()[0]["downloadedBytes"] >= 1 * MiB)
    assert engine.cancel(ticket.digest, wait=10)

    entry = engine.entry(ticket.digest)
    assert entry.state == FAILED and entry.reason == "Canceled" and entry.retry_time is None
    kept = entry.downloaded_bytes
    assert kept >= 1 * MiB
    fakehub.faults.clear()
    engine.ensure(ticket)  # no backoff after a cancel
    assert engine.wait(ticket.digest, timeout=30).state == READY
    assert engine.stats(ticket.digest)["resumed_hash_bytes"] >= kept - 256 * 1024
    assert (engine.path(ticket.digest) / "model.safetensors").read_bytes() == data


def test_it_finds_published_trees_after_restart_without_hub_requests(fakehub, make_engine, clock):
    commit = fakehub.add_hf_repo("org/keep", {"config.json": b"{}", "model.safetensors": random_bytes(MiB, seed=20)})
    ticket = ticket_for(fakehub, "org/keep", commit)
    engine = make_engine(clock=clock)
    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).state == READY
    engine.close()
    fakehub.clear_requests()

    clock.advance(3600)
    restarted = make_engine(clock=clock)
    [entry] = restarted.entries()
    assert entry.digest == ticket.digest and entry.state == READY
    assert entry.size_bytes == entry.downloaded_bytes == ticket.size
    assert restarted.ensure(ticket).state == READY
    assert restarted.entry(ticket.digest).last_used_time == clock.now
    assert not restarted.running()
    assert restarted.wait(ticket.digest, timeout=30).state == READY  # nothing was started behind it
    assert fakehub.requests == []
    assert tree_files(restarted.path(ticket.digest)) == fakehub.files("org/keep", commit)


def test_it_resumes_an_interrupted_download_after_restart(fakehub, make_engine):
    data = random_bytes(3 * MiB, seed=21)
    commit = fakehub.add_hf_repo("org/resume", {"model.safetensors": data})
    fakehub.faults.throttle("model.safetensors", 1 * MiB, listener="cdn")
    ticket = ticket_for(fakehub, "org/resume", commit)
    engine = make_engine()
    engine.ensure(ticket)
    wait_for(lambda: engine.running() and engine.running()[0]["downloadedBytes"] >= 1 * MiB)
    engine.close()  # the plugin stops: the download stays resumable

    restarted = make_engine()
    entry = restarted.entry(ticket.digest)
    assert entry.state == DOWNLOADING and entry.downloaded_bytes >= 1 * MiB and not restarted.running()
    fakehub.faults.clear()
    restarted.ensure(ticket)
    assert restarted.wait(ticket.digest, timeout=30).state == READY
    assert restarted.stats(ticket.digest)["resumed_hash_bytes"] >= 1 * MiB


def test_the_removal_time_runs_from_the_announced_collect_time_and_the_time_shown_never_moves(
    fakehub, make_engine, clock
):
    """The node's removal delay runs from the collectTime the spec announced: the status shows that time plus
    the delay from the moment the grace begins, and keeps it when the digest leaves the spec (a little late,
    as the service's reconcile may be), across a restart; still in the spec, a tree is never removed."""
    commit = fakehub.add_hf_repo("org/graced", {"config.json": b'{"g": 1}'})
    ticket = ticket_for(fakehub, "org/graced", commit)
    delay = 60
    engine = make_engine(clock=clock, removal_delay=delay)
    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).state == READY
    announced = float(int(clock.now)) + 30  # collectTime is to the second
    engine.set_wanted([{"digest": ticket.digest, "collectTime": rfc3339(announced)}])
    shown = rfc3339(announced + delay)
    assert engine.entry(ticket.digest).status()["collectTime"] == shown
    clock.advance(40)
    engine.close()

    restarted = make_engine(clock=clock, removal_delay=delay)
    restarted.set_wanted([{"digest": ticket.digest, "collectTime": rfc3339(announced)}])
    restarted.set_wanted([])  # it leaves the spec 10 s after its collectTime
    assert restarted.entry(ticket.digest).status()["collectTime"] == shown
    clock.advance(announced + delay - clock.now - 1)
    assert restarted.collect() == []
    clock.advance(1)
    assert restarted.collect() == [ticket.digest]

    # Past its removal time while the spec still lists it: kept until it leaves, then removed at once.
    restarted.set_wanted([{"digest": ticket.digest}])
    restarted.ensure(ticket)
    assert restarted.wait(ticket.digest, timeout=30).state == READY
    announced = float(int(clock.now)) + 5
    restarted.set_wanted([{"digest": ticket.digest, "collectTime": rfc3339(announced)}])
    clock.advance(5 + delay + 10)
    assert restarted.collect() == []
    restarted.set_wanted([])
    assert restarted.collect() == [ticket.digest]


def test_it_removes_a_tree_only_after_the_removal_delay(fakehub, make_engine, clock):
    kept_commit = fakehub.add_hf_repo("org/kept", {"config.json": b'{"a": 1}'})
    gone_commit = fakehub.add_hf_repo("org/gone", {"config.json": b'{"b": 2}'})
    kept, gone = ticket_for(fakehub, "org/kept", kept_commit), ticket_for(fakehub, "org/gone", gone_commit)
    removed_events = []
    delay = 600
    engine = make_engine(
        clock=clock, removal_delay=delay, on_change=lambda d, e: e is None and removed_events.append(d)
    )
    for ticket in (kept, gone):
        engine.ensure(ticket)
        assert engine.wait(ticket.digest, timeout=30).state == READY
    assert engine.collect() == []  # the spec is not known yet: nothing is collected

    engine.set_wanted([{"digest": kept.digest}, {"digest": gone.digest}])
    assert engine.collect() == []
    engine.set_wanted([{"digest": kept.digest}])  # gone is out of spec.models from now on
    left = clock.now
    assert engine.entry(gone.digest).status()["collectTime"] == rfc3339(left + delay)
    assert "collectTime" not in engine.entry(kept.digest).status()
    clock.advance(delay - 1)
    assert engine.collect() == []
    engine.close()

    # A restart neither resets the absence clock nor deletes early.
    restarted = make_engine(clock=clock, removal_delay=delay)
    restarted.set_wanted([{"digest": kept.digest}])
    assert restarted.collect() == []
    assert restarted.entry(gone.digest).collect_time == left + delay
    assert restarted.path(gone.digest) is not None
    clock.advance(1)
    assert restarted.collect() == [gone.digest]
    assert restarted.path(gone.digest) is None and restarted.entry(gone.digest) is None
    assert not restarted.cache.record_path(gone.digest).exists()
    assert [e.digest for e in restarted.entries()] == [kept.digest]

    # Back in spec.models resets the clock.
    restarted.set_wanted([])
    clock.advance(delay - 1)
    restarted.set_wanted([{"digest": kept.digest, "pinned": True}])
    clock.advance(delay)
    assert restarted.collect() == []
    assert restarted.path(kept.digest) is not None
    assert restarted.entry(kept.digest).status()["pinned"] is True
    assert removed_events == []  # the first engine removed nothing


def test_it_downloads_only_referenced_items_and_keeps_unreferenced_trees(fakehub, make_engine, clock):
    ready_commit = fakehub.add_hf_repo("org/held", {"config.json": b'{"held": 1}'})
    absent_commit = fakehub.add_hf_repo("org/absent", {"config.json": b'{"absent": 1}'})
    held, absent = ticket_for(fakehub, "org/held", ready_commit), ticket_for(fakehub, "org/absent", absent_commit)
    engine = make_engine(clock=clock)
    engine.set_wanted([{"digest": held.digest}])
    engine.ensure(held)
    assert engine.wait(held.digest, timeout=30).state == READY
    fakehub.clear_requests()

    collect_at = "2030-01-01T00:00:00Z"
    engine.set_wanted(
        [
            {"digest": held.digest, "pinned": True, "collectTime": collect_at},
            {"digest": absent.digest, "collectTime": collect_at},
        ]
    )
    assert engine.ensure(absent) is None  # not referenced: not started
    assert engine.entry(absent.digest) is None and not engine.running()
    status = engine.entry(held.digest).status()
    # The status says when the node removes it: the spec's collectTime plus the node's removal delay (60 s).
    assert status["state"] == READY and status["collectTime"] == "2030-01-01T00:01:00Z" and status["pinned"] is True
    assert engine.ensure(held).state == READY
    assert engine.collect() == []

    engine.set_wanted([{"digest": held.digest}, {"digest": absent.digest}])  # referenced again
    assert engine.ensure(held).state == READY
    assert set(engine.entry(held.digest).status()) == {
        "digest",
        "state",
        "sizeBytes",
        "downloadedBytes",
        "lastUsedTime",
        "source",
    }
    assert fakehub.requests == []  # a published tree is Ready at once
    engine.ensure(absent)
    assert engine.wait(absent.digest, timeout=30).state == READY


def test_it_stops_the_download_of_an_unreferenced_item_and_resumes_it_when_referenced(fakehub, make_engine, clock):
    data = random_bytes(3 * MiB, seed=31)
    commit = fakehub.add_hf_repo("org/unref", {"model.safetensors": data})
    fakehub.faults.throttle("model.safetensors", 1 * MiB, listener="cdn")
    ticket = ticket_for(fakehub, "org/unref", commit)
    engine = make_engine(clock=clock)
    engine.set_wanted([{"digest": ticket.digest}])
    engine.ensure(ticket)
    wait_for(lambda: engine.running() and engine.running()[0]["downloadedBytes"] >= 1 * MiB)

    engine.set_wanted([{"digest": ticket.digest, "collectTime": "2030-01-01T00:00:00Z"}])
    entry = engine.wait(ticket.digest, timeout=10)
    assert not engine.running() and entry.state == FAILED and entry.reason == "Canceled"
    assert entry.retry_time is None and entry.downloaded_bytes >= 1 * MiB
    assert engine.cache.partial(ticket.digest).exists()
    assert engine.ensure(ticket).state == FAILED and not engine.running()  # still unreferenced: not continued

    fakehub.faults.clear()
    engine.set_wanted([{"digest": ticket.digest}])
    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).state == READY
    assert engine.stats(ticket.digest)["resumed_hash_bytes"] >= 1 * MiB - 256 * KiB
    assert (engine.path(ticket.digest) / "model.safetensors").read_bytes() == data


def test_it_keeps_partial_work_out_of_spec_for_the_partial_retention(fakehub, make_engine, clock):
    commit = fakehub.add_hf_repo("org/partial", {"model.safetensors": random_bytes(3 * MiB, seed=32)})
    fakehub.faults.throttle("model.safetensors", 1 * MiB, listener="cdn")
    ticket = ticket_for(fakehub, "org/partial", commit)
    engine = make_engine(clock=clock, removal_delay=5, partial_retention=30)
    engine.set_wanted([{"digest": ticket.digest}])
    engine.ensure(ticket)
    wait_for(lambda: engine.running() and engine.running()[0]["downloadedBytes"] >= 1 * MiB)

    engine.set_wanted([])  # left spec.models: the download stops, its partial work stays
    left = clock.now
    entry = engine.wait(ticket.digest, timeout=10)
    assert not engine.running() and entry.state == FAILED and entry.downloaded_bytes >= 1 * MiB
    assert entry.status()["collectTime"] == rfc3339(left + 30)
    clock.advance(29)
    assert engine.collect() == []  # past the removal delay of trees, within the retention of partial work
    assert engine.cache.partial(ticket.digest).exists()
    engine.close()

    restarted = make_engine(clock=clock, removal_delay=5, partial_retention=30)
    restarted.set_wanted([])
    assert restarted.collect() == [] and restarted.entry(ticket.digest).collect_time == left + 30
    clock.advance(1)
    assert restarted.collect() == [ticket.digest]
    assert not restarted.cache.partial(ticket.digest).exists()
    assert not restarted.cache.record_path(ticket.digest).exists() and restarted.entries() == []


def one_mib_trees(fakehub, engine, clock, names, seed):
    """Download a 1 MiB tree per name, one a minute apart (so each was last used later); their tickets."""
    tickets = {}
    for i, name in enumerate(names):
        commit = fakehub.add_hf_repo(f"org/{name}", {"model.safetensors": random_bytes(MiB, seed=seed + i)})
        tickets[name] = ticket_for(fakehub, f"org/{name}", commit)
    engine.set_wanted([{"digest": t.digest} for t in tickets.values()])
    for ticket in tickets.values():
        clock.advance(60)
        engine.ensure(ticket)
        assert engine.wait(ticket.digest, timeout=30).state == READY
    return tickets


def test_it_evicts_least_recently_used_down_to_the_low_watermark(fakehub, make_engine, clock):
    engine = make_engine(clock=clock, capacity_bytes=10 * MiB, high_percent=90, low_percent=80, removal_delay=3600)
    names = ["out-a", "referenced", "pinned", "unref", "out-b", "pinned-referenced"]
    t = one_mib_trees(fakehub, engine, clock, names, seed=40)
    clock.advance(60)
    engine.touch(t["out-a"].digest)  # used last: evicted last
    collect_at = "2030-01-01T00:00:00Z"
    engine.set_wanted(
        [
            {"digest": t["referenced"].digest},
            {"digest": t["pinned"].digest, "pinned": True, "collectTime": collect_at},
            {"digest": t["unref"].digest, "collectTime": collect_at},
            {"digest": t["pinned-referenced"].digest, "pinned": True},
        ]
    )
    assert engine.collect() == []  # 60 %: under the high watermark
    assert engine.capacity()["usedPercent"] == 60

    engine.set_watermarks(50, 40)
    assert engine.collect() == [t["unref"].digest, t["out-b"].digest]  # least recently used first, down to 40 %
    assert engine.capacity()["usedPercent"] == 40
    assert engine.collect() == []
    engine.set_watermarks(30, 10)  # only out-a may still go; referenced and pinned trees stay
    assert engine.collect() == [t["out-a"].digest]
    assert engine.collect() == []
    held = {e.digest for e in engine.entries()}
    assert held == {t[n].digest for n in ("referenced", "pinned", "pinned-referenced")}
    assert all(engine.path(d) is not None for d in held)


def test_it_evicts_to_make_room_and_says_how_many_bytes_are_missing(fakehub, make_engine, clock, caplog):
    engine = make_engine(clock=clock, capacity_bytes=10 * MiB, high_percent=50, low_percent=40, removal_delay=3600)
    t = one_mib_trees(fakehub, engine, clock, ["old", "older", "kept"], seed=50)
    big = fakehub.add_hf_repo("org/big", {"model.safetensors": random_bytes(3 * MiB, seed=53)})
    huge = fakehub.add_hf_repo("org/huge", {"model.safetensors": random_bytes(3 * MiB, seed=54)})
    big, huge = ticket_for(fakehub, "org/big", big), ticket_for(fakehub, "org/huge", huge)
    engine.touch(t["old"].digest)  # "older" was used before "old"
    engine.set_wanted([{"digest": t["kept"].digest}, {"digest": big.digest}, {"digest": huge.digest}])
    assert engine.collect() == []  # 30 %: no pressure

    with caplog.at_level("INFO", logger="gpustack_models.plugin.engine.capacity"):
        engine.ensure(big)  # 3 MiB held + 3 MiB > 5 MiB: the least recently used out-of-spec tree goes
        assert engine.wait(big.digest, timeout=30).state == READY
    assert engine.entry(t["older"].digest) is None and engine.path(t["older"].digest) is None
    assert engine.path(t["old"].digest) is not None and engine.path(t["kept"].digest) is not None
    [evicted] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evicted")]
    assert t["older"].digest in evicted and f"({MiB} bytes, last used " in evicted and "high 50%, low 40%" in evicted

    fakehub.clear_requests()
    engine.set_watermarks(60, 50)  # 5 of 6 MiB used: 1 MiB free
    engine.ensure(huge)  # 3 MiB more: evicting "old" would not make room, so nothing is evicted in vain
    entry = engine.wait(huge.digest, timeout=30)
    assert entry.state == FAILED and entry.reason == "InsufficientCapacity", entry
    assert f"needs {3 * MiB} more bytes, {1 * MiB} bytes are free under" in entry.message
    assert engine.path(t["old"].digest) is not None and fakehub.requests == []


def test_it_evicts_partial_work_out_of_spec_but_never_a_running_download(fakehub, make_engine, clock):
    left_commit = fakehub.add_hf_repo("org/left", {"model.safetensors": random_bytes(3 * MiB, seed=60)})
    live_commit = fakehub.add_hf_repo("org/live", {"model.safetensors": random_bytes(3 * MiB, seed=61)})
    left, live = ticket_for(fakehub, "org/left", left_commit), ticket_for(fakehub, "org/live", live_commit)
    fakehub.faults.throttle("model.safetensors", 1 * MiB, listener="cdn")
    engine = make_engine(clock=clock, capacity_bytes=10 * MiB, high_percent=90, low_percent=80)
    engine.set_wanted([{"digest": left.digest}])
    engine.ensure(left)
    wait_for(lambda: engine.running() and engine.running()[0]["downloadedBytes"] >= 1 * MiB)
    engine.set_wanted([{"digest": live.digest}])  # left stops, its partial work stays (24 h retention)
    assert engine.wait(left.digest, timeout=10).state == FAILED and engine.cache.partial(left.digest).exists()
    engine.ensure(live)
    wait_for(lambda: engine.running() and engine.running()[0]["downloadedBytes"] >= 256 * KiB)

    engine.set_watermarks(5, 1)  # far above the high watermark: only the partial work out of spec may go
    assert engine.collect() == [left.digest]
    assert not engine.cache.partial(left.digest).exists() and engine.entry(left.digest) is None
    assert engine.collect() == []
    assert [r["digest"] for r in engine.running()] == [live.digest]
    fakehub.faults.clear()
    assert engine.wait(live.digest, timeout=30).state == READY


def test_it_reports_capacity_of_the_real_volume(make_engine):
    engine = make_engine()
    capacity = engine.capacity()
    st = os.statvfs(engine.cache.root)
    assert capacity["totalBytes"] == st.f_blocks * st.f_frsize
    assert capacity["storedBytes"] == 0
    assert 0 <= capacity["usedPercent"] <= 100


def test_it_exports_metrics_without_digests_in_labels(fakehub, make_engine, clock):
    ok = fakehub.add_hf_repo("org/ok", {"config.json": b"{}", "model.safetensors": random_bytes(MiB, seed=22)})
    bad = fakehub.add_hf_repo("org/broken", {"config.json": b'{"x": 1}'})
    fakehub.faults.fail("org/broken", 502, times=None)
    metrics = Metrics()
    engine = make_engine(metrics=metrics, clock=clock)
    good_ticket, bad_ticket = ticket_for(fakehub, "org/ok", ok), ticket_for(fakehub, "org/broken", bad)
    for ticket in (good_ticket, bad_ticket):
        engine.ensure(ticket)
        engine.wait(ticket.digest, timeout=30)

    text = generate_latest(metrics.registry).decode()
    [value] = [
        float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("gpustack_models_plugin_downloaded_bytes_total ")
    ]
    assert value >= MiB
    assert 'gpustack_models_plugin_download_failures_total{reason="SourceUnavailable"} 1.0' in text
    assert 'gpustack_models_plugin_models{state="Ready"} 1.0' in text
    assert 'gpustack_models_plugin_models{state="Failed"} 1.0' in text
    assert "gpustack_models_plugin_capacity_bytes" in text
    for ticket in (good_ticket, bad_ticket):
        assert ticket.hex[:12] not in text and ticket.repository not in text


def test_it_serves_state_reads_while_a_download_is_blocked(fakehub, make_engine):
    """Reads from other threads (the status writer, the live endpoint) never wait for a download:
    they answer while the download's reader is held mid-body by the hub."""
    data = random_bytes(512 * KiB, seed=23)  # one part, one request
    commit = fakehub.add_hf_repo("org/busy", {"model.safetensors": data})
    held_at = 4 * 64 * KiB  # a multiple of the read buffer: all of it written and hashed
    fakehub.faults.stall("model.safetensors", after_bytes=held_at, listener="cdn")  # until the hub stops
    ticket = ticket_for(fakehub, "org/busy", commit)
    engine = make_engine(settings=settings(stall_timeout=60))
    engine.ensure(ticket)
    wait_for(lambda: engine.running() and engine.running()[0]["downloadedBytes"] == held_at)
    answers = {}

    def read():
        answers.update(entries=engine.entries(), running=engine.running(), capacity=engine.capacity())
        answers.update(stats=engine.stats(ticket.digest), entry=engine.entry(ticket.digest))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)  # a deadline against a reader stuck behind the download, not a measure of speed

    assert not reader.is_alive(), "state reads waited for the download"
    [stalled] = [r for r in fakehub.requests if r.fault == "stall"]
    assert stalled.bytes_sent == held_at and engine.running()  # still held while the reads answered
    assert [(e.digest, e.state, e.downloaded_bytes) for e in answers["entries"]] == [
        (ticket.digest, DOWNLOADING, held_at)
    ]
    (running,) = answers["running"]
    assert running.pop("bytesPerSecond") >= 0
    assert running == {"digest": ticket.digest, "downloadedBytes": held_at, "sizeBytes": len(data), "source": "Hub"}
    assert answers["entry"].state == DOWNLOADING and answers["stats"]["requests"] == 1
    assert answers["capacity"]["storedBytes"] == held_at
    assert engine.cancel(ticket.digest, wait=10)
    assert engine.entry(ticket.digest).reason == "Canceled"


def test_it_never_removes_nor_evicts_a_mounted_tree_and_keeps_its_last_use_current(fakehub, make_engine, clock):
    engine = make_engine(clock=clock, capacity_bytes=10 * MiB, high_percent=90, low_percent=80, removal_delay=0)
    t = one_mib_trees(fakehub, engine, clock, ["mounted", "other"], seed=60)
    mounted, other = t["mounted"].digest, t["other"].digest
    engine.set_mounted([mounted])
    engine.set_wanted([])  # both left spec.models
    clock.advance(5)
    assert engine.collect() == [other]  # the removal delay (0) passed: only the unmounted one goes
    assert "collectTime" not in engine.entry(mounted).status()
    engine.set_watermarks(5, 1)  # pressure: the mounted tree is all that is left, and it stays
    assert engine.collect() == []
    assert engine.path(mounted) is not None
    engine.touch(mounted)  # mounted now
    used = engine.entry(mounted).last_used_time
    clock.advance(30)
    assert engine.touch_mounted(60) == []  # used 30 s ago: not yet
    clock.advance(31)
    assert engine.touch_mounted(60) == [mounted]
    assert engine.entry(mounted).last_used_time == used + 61
    engine.close()

    restarted = make_engine(clock=clock, capacity_bytes=10 * MiB, removal_delay=0)  # mounts are known again
    restarted.set_wanted([])
    restarted.set_mounted([mounted])
    assert restarted.collect() == [] and restarted.path(mounted) is not None
    restarted.set_mounted([])  # unmounted: the removal delay counts from now
    clock.advance(1)
    assert restarted.collect() == [mounted]
