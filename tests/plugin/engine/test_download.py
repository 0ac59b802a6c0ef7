"""The range downloader against the fake hub, through the real HTTP path (hub, redirects, CDN)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpustack_models.plugin.engine import FAILED, READY, Cache, Download, FetchTicket, Limits
from gpustack_models.plugin.engine.cache import read_json
from gpustack_models.plugin.engine.download import Parts
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.sources.manifest import ManifestFile, manifest_digest
from tests.plugin.conftest import (
    InFlight,
    KiB,
    MiB,
    random_bytes,
    range_start_end,
    settings,
    ticket_for,
    tree_files,
    wait_for,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def repo_files():
    return {
        "config.json": b'{"model_type": "llama"}',
        "tokenizer/vocab.txt": random_bytes(700, seed=9),  # under the LFS threshold: a git blob
        "model-00001.safetensors": random_bytes(3 * MiB + 123, seed=1),
        "model-00002.safetensors": random_bytes(600 * KiB, seed=2),
        "empty.txt": b"",
    }


def test_it_publishes_files_byte_identical_to_the_hub(fakehub, make_engine):
    commit = fakehub.add_hf_repo("org/model", repo_files())
    ticket = ticket_for(fakehub, "org/model", commit)
    changes = []
    engine = make_engine(on_change=lambda digest, entry: changes.append(entry and entry.state))

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == READY and entry.reason is None
    assert entry.size_bytes == entry.downloaded_bytes == ticket.size
    tree = engine.path(ticket.digest)
    assert tree == engine.cache.root / "models" / ticket.hex
    assert tree_files(tree) == fakehub.files("org/model", commit)
    assert not (engine.cache.root / "partial" / ticket.hex).exists()
    assert changes[0] == "Downloading" and changes[-1] == "Ready"
    # LFS files were redirected to the CDN and fetched there.
    assert any(r.listener == "cdn" and r.status == 206 for r in fakehub.requests)


def test_it_fetches_a_big_file_as_parallel_ranges(fakehub, make_engine):
    data = random_bytes(4 * MiB, seed=3)
    commit = fakehub.add_hf_repo("org/big", {"model.safetensors": data})
    fakehub.faults.throttle("model.safetensors", 2 * MiB, listener="cdn")  # per connection
    ticket = ticket_for(fakehub, "org/big", commit)
    in_flight = InFlight(fakehub)
    engine = make_engine(concurrency=4)

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == READY
    assert (engine.path(ticket.digest) / "model.safetensors").read_bytes() == data
    cdn = [r for r in fakehub.requests if r.listener == "cdn" and r.status == 206]
    ranges = sorted(range_start_end(r.range, len(data)) for r in cdn)
    assert len(ranges) == 16  # 4 MiB in 256 KiB parts
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # each byte asked for once
    assert sum(r.bytes_sent for r in cdn) == len(data)
    # The ranges were fetched side by side: all four connections had a range in flight at once
    # (how much faster that is, the benchmark's throttled scenario measures).
    assert in_flight.peak == 4


def test_it_resumes_a_dropped_connection_without_refetching_finished_ranges(fakehub, make_engine):
    data = random_bytes(3 * MiB, seed=4)
    commit = fakehub.add_hf_repo("org/drop", {"model.safetensors": data})
    fakehub.faults.drop("model.safetensors", after_bytes=200_000, listener="cdn")  # once
    ticket = ticket_for(fakehub, "org/drop", commit)
    engine = make_engine(concurrency=2)

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == READY
    assert (engine.path(ticket.digest) / "model.safetensors").read_bytes() == data
    cdn = [r for r in fakehub.requests if r.listener == "cdn"]
    dropped = [r for r in cdn if r.fault == "drop"]
    assert len(dropped) == 1
    start, end = range_start_end(dropped[0].range, len(data))
    assert dropped[0].bytes_sent == 200_000
    # The retry asks for exactly what was missing of that range, from the first byte not written.
    retry = [r for r in cdn if r.fault is None and range_start_end(r.range, len(data))[1] == end]
    assert [range_start_end(r.range, len(data)) for r in retry] == [(start + 200_000, end)]
    # Nothing was sent twice: the bytes the hub sent add up to the file.
    assert sum(r.bytes_sent for r in cdn) == len(data)
    assert engine.stats(ticket.digest)["retries"] == 1


def test_it_retries_a_stalled_range_from_its_last_byte(fakehub, make_engine):
    data = random_bytes(2 * MiB, seed=5)
    commit = fakehub.add_hf_repo("org/stall", {"model.safetensors": data})
    # A multiple of the read buffer (64 KiB): every byte sent before the stall was read and written.
    sent = 2 * 64 * KiB
    fakehub.faults.stall("model.safetensors", after_bytes=sent, listener="cdn")  # then silent until the hub stops
    ticket = ticket_for(fakehub, "org/stall", commit)
    engine = make_engine(concurrency=2, settings=settings(stall_timeout=0.5))

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == READY
    assert (engine.path(ticket.digest) / "model.safetensors").read_bytes() == data
    cdn = [r for r in fakehub.requests if r.listener == "cdn"]
    [stalled] = [r for r in cdn if r.fault == "stall"]
    assert stalled.bytes_sent == sent
    start, end = range_start_end(stalled.range, len(data))
    assert end - start > sent  # the range stalled part-way
    # The retry asks for exactly the missing remainder of that range.
    retry = [r for r in cdn if r is not stalled and range_start_end(r.range, len(data))[1] == end]
    assert [r.range for r in retry] == [f"bytes={start + sent}-{end - 1}"]
    assert sum(r.bytes_sent for r in cdn) == len(data)  # nothing was sent twice
    assert engine.stats(ticket.digest)["retries"] == 1


def test_it_retries_a_range_whose_answer_never_comes(fakehub, make_engine):
    data = random_bytes(2 * MiB, seed=5)
    commit = fakehub.add_hf_repo("org/hang", {"model.safetensors": data})
    fakehub.faults.hang("model.safetensors", seconds=3, listener="cdn")  # no status line, no byte
    ticket = ticket_for(fakehub, "org/hang", commit)
    engine = make_engine(concurrency=2, settings=settings(stall_timeout=0.5))

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == READY
    assert (engine.path(ticket.digest) / "model.safetensors").read_bytes() == data
    hung = [r for r in fakehub.requests if r.fault == "hang"]
    assert len(hung) == 1
    again = [r for r in fakehub.requests if r.listener == "cdn" and r.range == hung[0].range and r.status == 206]
    assert len(again) == 1
    assert engine.stats(ticket.digest)["retries"] == 1


_CHILD = r"""
import json, sys, time
from gpustack_models.plugin.engine import Engine, FetchTicket, DownloadSettings
spec = json.loads(sys.argv[1])
ticket = FetchTicket.from_dict(spec["ticket"])
engine = Engine(spec["root"], settings=DownloadSettings(**spec["settings"]), concurrency=2)
engine.ensure(ticket)
entry = engine.wait(ticket.digest, timeout=120)
print(json.dumps({"state": entry.state, "reason": entry.reason, "stats": engine.stats(ticket.digest)}), flush=True)
"""


def _child(ticket: FetchTicket, root: Path, **settings_overrides) -> subprocess.Popen:
    spec = {
        "ticket": ticket.to_dict(),
        "root": str(root),
        "settings": {**settings().__dict__, **settings_overrides},
    }
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, json.dumps(spec)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True
    )


def test_it_resumes_after_sigkill_from_the_checkpoint(fakehub, cache_root):
    data = random_bytes(6 * MiB, seed=6)
    commit = fakehub.add_hf_repo("org/kill", {"config.json": b"{}", "model.safetensors": data})
    ticket = ticket_for(fakehub, "org/kill", commit)
    fakehub.faults.throttle("model.safetensors", 1 * MiB, listener="cdn")  # ~2 MiB/s with 2 connections
    checkpoint_path = cache_root / "partial" / ticket.hex / "checkpoint.json"

    first = _child(ticket, cache_root)
    try:

        def progressed():
            doc = read_json(checkpoint_path)
            entry = (doc or {}).get("files", {}).get("model.safetensors") or {}
            return entry if entry.get("hashed", 0) >= 2 * MiB else None

        wait_for(progressed, timeout=20)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL
    saved = read_json(checkpoint_path)["files"]["model.safetensors"]
    written = [tuple(r) for r in saved["written"]]
    hashed = saved["hashed"]
    assert saved["hash"] and hashed >= 2 * MiB
    assert written[0][0] == 0 and written[0][1] >= hashed
    before = len(fakehub.requests)
    fakehub.faults.clear()

    second = _child(ticket, cache_root)
    out, _ = second.communicate(timeout=60)
    result = json.loads(out.strip().splitlines()[-1])

    assert result["state"] == READY, result
    assert tree_files(cache_root / "models" / ticket.hex) == fakehub.files("org/kill", commit)
    after = [r for r in fakehub.requests[before:] if r.listener == "cdn" and r.status in (200, 206)]
    asked = [range_start_end(r.range, len(data)) for r in after]
    assert asked, "the restarted process fetched nothing"
    for start, end in asked:  # only what the checkpoint did not hold
        assert all(end <= s or start >= e for s, e in written), (start, end, written)
    on_disk = sum(e - s for s, e in written)
    assert sum(e - s for s, e in asked) == len(data) - on_disk
    # The hash went on from the saved state: the hashed prefix was neither fetched nor read again.
    stats = result["stats"]
    assert stats["resumed_bytes"] == on_disk + 2  # and config.json, verified before the kill
    assert stats["resumed_hash_bytes"] == hashed + 2
    assert stats["reread_bytes"] <= len(data) - hashed


def test_it_fails_with_integrity_mismatch_on_a_corrupted_byte_and_publishes_nothing(fakehub, make_engine, clock):
    data = random_bytes(2 * MiB, seed=7)
    commit = fakehub.add_hf_repo("org/bad", {"config.json": b"{}", "model.safetensors": data})
    fakehub.faults.corrupt("model.safetensors", offset=1000, listener="cdn")
    ticket = ticket_for(fakehub, "org/bad", commit)
    engine = make_engine(clock=clock)

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == FAILED and entry.reason == "IntegrityMismatch"
    assert "model.safetensors" in entry.message and "sha256" in entry.message
    assert entry.retry_time == clock.now + 60
    assert engine.path(ticket.digest) is None
    assert os.listdir(engine.cache.root / "models") == []
    partial = engine.cache.root / "partial" / ticket.hex
    assert not (partial / "tree" / "model.safetensors").exists()  # the bad file's data is gone
    saved = read_json(partial / "checkpoint.json")["files"]
    assert saved["model.safetensors"]["written"] == [] and saved["config.json"]["verified"] is True

    # Once the hub serves the right bytes, the next attempt publishes, fetching only that file.
    clock.advance(61)
    before = len(fakehub.requests)
    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).state == READY
    asked = [r.target for r in fakehub.requests[before:]]
    assert asked and all("model.safetensors" in target for target in asked), asked
    assert (engine.path(ticket.digest) / "model.safetensors").read_bytes() == data


def test_it_downloads_from_modelscope(fakehub, make_engine):
    files = {
        "configuration.json": b'{"framework": "pytorch"}',
        "weights/model.safetensors": random_bytes(2 * MiB + 5, seed=8),
        "README.md": random_bytes(900, seed=10),
    }
    commit = fakehub.add_ms_repo("owner/model", files)
    ticket = ticket_for(fakehub, "owner/model", commit, kind="ms")
    assert all(f.algorithm == "sha256" for f in ticket.files)
    engine = make_engine()

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == READY, entry
    assert tree_files(engine.path(ticket.digest)) == fakehub.files("owner/model", commit, kind="ms")
    hub_gets = [r for r in fakehub.requests if r.listener == "hub"]
    assert {r.path for r in hub_gets} == {"/api/v1/models/owner/model/repo"}
    assert {r.query["FilePath"][0] for r in hub_gets} == set(files)
    assert all(r.query["Revision"] == [commit] for r in hub_gets)
    assert any(r.listener == "cdn" for r in fakehub.requests)  # LFS went through the CDN


def test_it_sends_the_token_to_the_hub_only(fakehub, make_engine):
    token = "hf_secret_token_0123456789"
    commit = fakehub.add_hf_repo("org/private", repo_files(), private=True, token=token)
    ticket = ticket_for(fakehub, "org/private", commit, token=token)
    engine = make_engine()

    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).state == READY

    assert {r.token for r in fakehub.requests if r.listener == "hub"} == {token}
    assert {r.token for r in fakehub.requests if r.listener == "cdn"} == {None}
    assert token not in repr(ticket) and token not in str(ticket)
    on_disk = [Path(dirpath, name) for dirpath, _, names in os.walk(engine.cache.root) for name in names]
    assert len(on_disk) > len(repo_files())  # the published files, and the engine's record
    for path in on_disk:  # nothing on disk carries it
        assert token.encode() not in path.read_bytes()


@pytest.mark.parametrize(
    ("error", "reason", "message"),
    [
        (errno.ENOSPC, "InsufficientCapacity", "the cache volume is full"),
        (errno.EIO, "SourceUnavailable", "writing the cache failed"),
    ],
    ids=["volume-full", "io-error"],
)
def test_it_fails_at_once_on_a_disk_error(fakehub, make_engine, monkeypatch, error, reason, message):
    data = random_bytes(2 * MiB, seed=12)
    commit = fakehub.add_hf_repo("org/disk", {"model.safetensors": data})
    ticket = ticket_for(fakehub, "org/disk", commit)
    pwrite = os.pwrite

    def failing_pwrite(fd, chunk, offset):
        if offset >= 1 * MiB:  # the second half of the file cannot be written
            raise OSError(error, os.strerror(error))
        return pwrite(fd, chunk, offset)

    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    engine = make_engine(concurrency=2)

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == FAILED and entry.reason == reason, entry
    assert message in entry.message
    assert engine.stats(ticket.digest)["retries"] == 0  # a disk error is not a network one: no retry
    assert engine.path(ticket.digest) is None


@pytest.mark.parametrize("private", [True, False], ids=["private-no-token", "missing-file"])
def test_it_maps_refusals_to_access_denied(fakehub, make_engine, private):
    commit = fakehub.add_hf_repo("org/closed", {"config.json": b"{}"}, private=private, token="t" if private else None)
    files = [
        ManifestFile("config.json", 2, "gitsha1", fakehub.file_info("org/closed", "config.json", commit).blob.gitsha1)
    ]
    if not private:
        files.append(ManifestFile("missing.bin", 4, "sha256", "0" * 64, True))
    ticket = FetchTicket(manifest_digest(files), "huggingFace", fakehub.url, "org/closed", commit, files)
    engine = make_engine()

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == FAILED and entry.reason == "AccessDenied", entry
    assert "HTTP 401" in entry.message or "HTTP 404" in entry.message
    assert "org/closed" not in entry.message and commit not in entry.message  # status names no repository


def test_it_refuses_a_ticket_whose_files_do_not_match_its_digest(fakehub, make_engine):
    commit = fakehub.add_hf_repo("org/m", {"config.json": b"{}"})
    good = ticket_for(fakehub, "org/m", commit)
    forged = FetchTicket("sha256:" + "a" * 64, "huggingFace", fakehub.url, "org/m", commit, good.files)
    engine = make_engine()

    entry = engine.ensure(forged)

    assert entry.state == FAILED and entry.reason == "InvalidRequest"
    assert engine.wait(forged.digest, timeout=30).state == FAILED  # no download was started behind it
    assert not fakehub.requests


def test_it_downloads_with_the_downloader_alone(fakehub, tmp_path):
    commit = fakehub.add_hf_repo("org/solo", repo_files())
    ticket = ticket_for(fakehub, "org/solo", commit)
    download = Download(ticket, Cache(tmp_path / "c"), Limits(4), settings())

    tree = download.run()

    assert tree_files(tree) == fakehub.files("org/solo", commit)
    assert download.downloaded_bytes == download.size == ticket.size
    assert download.remaining_bytes == 0


def test_an_idle_thread_takes_the_second_half_of_the_longest_part_still_being_read(tmp_path):
    f = FileProgress(ManifestFile("a.bin", 40 * MiB, "sha256", "0" * 64, True), tmp_path / "a.bin")
    f.new_hash()
    parts = Parts(settings(split_threshold=1 * MiB, part_size=16 * MiB))
    parts.plan([f])
    a, b, c = parts.take(), parts.take(), parts.take()
    assert [(p.start, p.end) for p in (a, b, c)] == [(0, 16 * MiB), (16 * MiB, 32 * MiB), (32 * MiB, 40 * MiB)]
    a.claim, b.claim = 4 * MiB, 31 * MiB  # a's read reaches 4 MiB (12 left), b's 31 MiB; c not started (8 left)
    tail = parts.take()
    assert (tail.start, tail.end) == (10 * MiB, 16 * MiB) and a.end == 10 * MiB  # a stops at the cut
    a.claim, tail.claim, c.claim = a.end - KiB, tail.end - MiB, c.end - MiB
    parts.done(b)
    assert parts.take() is None  # no part has 2 MiB left: nothing worth another request


def test_a_slow_connection_s_tail_is_fetched_by_an_idle_one_and_no_byte_twice(fakehub, make_engine):
    data = random_bytes(8 * MiB, seed=31)
    commit = fakehub.add_hf_repo("org/tail", {"model.safetensors": data})
    fakehub.faults.throttle("/repos/", 1 * MiB, times=1)  # one part's connection only: 4 s alone
    engine = make_engine(settings=settings(split_threshold=1 * MiB, part_size=4 * MiB), concurrency=2)
    ticket = ticket_for(fakehub, "org/tail", commit)

    engine.ensure(ticket)
    entry = engine.wait(ticket.digest, timeout=30)

    assert entry.state == READY, entry
    assert (engine.path(ticket.digest) / "model.safetensors").read_bytes() == data
    starts = sorted({range_start_end(r.range, len(data))[0] for r in fakehub.requests if r.range})
    stolen = [s for s in starts if s % (4 * MiB)]  # a request starting inside a part: its tail, taken over
    assert {0, 4 * MiB} <= set(starts) and len(stolen) >= 1, starts
    assert engine.stats(ticket.digest)["network_bytes"] == len(data)


def test_a_file_under_the_split_threshold_stays_one_request(tmp_path):
    f = FileProgress(ManifestFile("b.bin", 8 * MiB, "sha256", "0" * 64, True), tmp_path / "b.bin")
    f.new_hash()
    parts = Parts(settings(split_threshold=64 * MiB))
    parts.plan([f])
    whole = parts.take()
    assert (whole.start, whole.end) == (0, 8 * MiB) and parts.take() is None and whole.end == 8 * MiB
