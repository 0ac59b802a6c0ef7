"""The record store on its own: an item's record and its round trip through the disk, what a restart
finds (published trees, partial work, records whose tree is gone, corrupt records), and the entries."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gpustack_models.plugin.engine import checkpoint
from gpustack_models.plugin.engine.cache import Cache, read_json
from gpustack_models.plugin.engine.lifecycle import Wanted
from gpustack_models.plugin.engine.records import (
    DOWNLOADING,
    FAILED,
    READY,
    SOURCE_HUB,
    SOURCE_PEER,
    TOUCH_PERSIST_SECONDS,
    Item,
    Records,
    entry_of,
    rfc3339,
)

NOW = 1_700_000_000.0


def digest(n: int) -> str:
    return "sha256:" + format(n, "064x")


def publish(cache: Cache, d: str, files: dict[str, bytes]) -> None:
    tree = cache.partial_tree(d)
    for path, data in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(data)
    cache.publish(d)


def partial(cache: Cache, d: str, size: int, hashed: int) -> None:
    """Partial work of ``d``: one file of ``size`` bytes, half written, ``hashed`` of them hashed."""
    tree = cache.partial_tree(d)
    tree.mkdir(parents=True)
    (tree / "model.bin").write_bytes(b"x" * (size // 2))
    entry = {"checksum": "sha256:" + "0" * 64, "size": size, "written": [[0, size // 2]], "hashed": hashed}
    checkpoint.save(cache.checkpoint_path(d), d, {"model.bin": entry, "config.json": {"size": 10, "verified": True}})


def loaded(root) -> Records:
    records = Records(Cache(root))
    records.load()
    return records


def full_item() -> Item:
    return Item(
        digest(1),
        state=FAILED,
        size=300,
        downloaded=120,
        failures=2,
        reason="SourceUnavailable",
        message="HTTP 503",
        retry_time=NOW + 120,
        last_used=NOW - 5,
        last_used_saved=NOW - 5,
        absent_since=NOW - 1,
        source=SOURCE_PEER,
    )


def test_an_item_survives_its_record():
    item = full_item()
    assert Item.from_record(item.digest, json.loads(json.dumps(item.record()))) == item


def test_a_corrupt_record_reads_as_unset_fields():
    record = {
        "state": "Exploded",
        "sizeBytes": "300",
        "downloadedBytes": -4,
        "failures": True,
        "reason": 7,
        "message": ["no"],
        "retryTime": True,
        "lastUsedTime": "yesterday",
        "absentSince": None,
        "source": "Elsewhere",
    }
    assert Item.from_record(digest(1), record) == Item(digest(1))


def test_a_record_saved_is_loaded_after_a_restart(tmp_path):
    records = Records(Cache(tmp_path))
    item = full_item()
    records.items[item.digest] = item
    records.persist(item)
    partial(records.cache, item.digest, size=8192, hashed=1024)  # its partial work, or the record goes

    restarted = loaded(tmp_path)
    again = restarted.get(item.digest)
    assert again.state == FAILED and again.failures == 2 and again.retry_time == NOW + 120
    assert again.reason == "SourceUnavailable" and again.absent_since == NOW - 1 and again.source == SOURCE_PEER
    assert (again.size, again.downloaded) == (8192 + 10, 1024 + 10)  # from the checkpoint


def test_a_restart_finds_published_trees_and_partial_work_and_drops_records_of_trees_gone(tmp_path):
    cache = Cache(tmp_path)
    tree, work, gone, failed, corrupt = (digest(n) for n in range(1, 6))
    publish(cache, tree, {"config.json": b"{}", "weights/model.bin": b"w" * 500})
    cache.save_record(tree, Item(tree, state=FAILED, failures=3, reason="AccessDenied", retry_time=NOW).record())
    partial(cache, work, size=8192, hashed=2048)
    cache.save_record(gone, Item(gone, state=READY, size=10, downloaded=10).record())
    cache.save_record(failed, Item(failed, state=FAILED, downloaded=50, reason="Canceled").record())
    publish(cache, corrupt, {"a.bin": b"a" * 7})
    cache.record_path(corrupt).write_text("{not json")
    partial(cache, corrupt, size=8192, hashed=0)  # left beside its published tree by a crash

    records = loaded(tmp_path)

    assert sorted(records.items) == [tree, work, failed, corrupt]
    found = records.get(tree)
    assert (found.state, found.size, found.downloaded) == (READY, 502, 502)
    assert (found.failures, found.reason, found.retry_time) == (0, None, None)
    assert read_json(cache.record_path(tree))["state"] == READY  # saved as found
    resumed = records.get(work)
    assert (resumed.state, resumed.size, resumed.downloaded) == (DOWNLOADING, 8192 + 10, 2048 + 10)
    assert records.idle_partial == {work: cache.partial_bytes(work)} and records.idle_partial[work] > 0
    assert not cache.record_path(gone).exists()
    kept = records.get(failed)
    assert (kept.state, kept.reason, kept.downloaded) == (FAILED, "Canceled", 0)
    assert records.get(corrupt).state == READY and records.get(corrupt).size == 7
    assert not cache.partial(corrupt).exists()


def test_a_checkpoint_of_another_version_counts_no_progress(tmp_path):
    cache = Cache(tmp_path)
    partial(cache, digest(1), size=8192, hashed=1024)
    document = read_json(cache.checkpoint_path(digest(1)))
    cache.checkpoint_path(digest(1)).write_text(json.dumps(dict(document, version=99)))
    cache.save_record(digest(1), Item(digest(1), state=DOWNLOADING, size=8202).record())

    item = loaded(tmp_path).get(digest(1))
    assert (item.state, item.size, item.downloaded) == (DOWNLOADING, 8202, 0)


def test_a_use_is_saved_at_most_once_a_minute_unless_asked(tmp_path):
    records = Records(Cache(tmp_path))
    item, _ = records.claim(digest(1))

    def saved():
        return read_json(records.cache.record_path(item.digest))["lastUsedTime"]

    records.touch(item, NOW)
    assert saved() == NOW  # never saved before
    records.touch(item, NOW + TOUCH_PERSIST_SECONDS - 1)
    assert item.last_used == NOW + TOUCH_PERSIST_SECONDS - 1 and saved() == NOW
    records.touch(item, NOW + TOUCH_PERSIST_SECONDS)
    assert saved() == NOW + TOUCH_PERSIST_SECONDS
    records.touch(item, NOW + TOUCH_PERSIST_SECONDS + 1, persist=True)
    assert saved() == NOW + TOUCH_PERSIST_SECONDS + 1


def test_claiming_a_digest_brings_it_back_and_removing_it_forgets_it(tmp_path):
    cache = Cache(tmp_path)
    publish(cache, digest(1), {"a.bin": b"a"})
    records = loaded(tmp_path)
    item = records.get(digest(1))
    item.absent_since = NOW
    assert records.claim(digest(1)) == (item, True) and item.absent_since is None
    assert records.claim(digest(1)) == (item, False)
    created, changed = records.claim(digest(2))
    assert created == Item(digest(2)) and not changed

    records.last_stats[digest(1)] = {"requests": 1}
    records.remove(digest(1))
    assert records.get(digest(1)) is None and digest(1) not in records.last_stats
    assert not cache.published(digest(1)) and not cache.record_path(digest(1)).exists()


def test_an_entry_shows_a_failure_only_while_failed():
    failed = entry_of(full_item())
    assert (failed.state, failed.reason, failed.message, failed.retry_time) == (
        FAILED,
        "SourceUnavailable",
        "HTTP 503",
        NOW + 120,
    )
    ready = entry_of(Item(digest(1), state=READY, size=300, downloaded=300, reason="old", retry_time=NOW))
    assert (ready.reason, ready.message, ready.retry_time) == (None, None, None)
    assert ready.status() == {
        "digest": digest(1),
        "state": READY,
        "sizeBytes": 300,
        "downloadedBytes": 300,
        "source": SOURCE_HUB,
    }


@pytest.mark.parametrize("reason", ["DiskOnFire", "", None, "sourceunavailable", "SourceUnavailable: HTTP 503"])
def test_a_failed_entry_reports_a_reason_outside_the_fixed_set_as_unknown(reason):
    """A record on disk may carry any text; kube-apiserver refuses a status whose reason is not one of the
    kind's, so the plugin never sends one."""
    item = full_item()
    item.reason = reason
    assert entry_of(item).status()["reason"] == "Unknown"
    item.reason = "IntegrityMismatch"
    assert entry_of(item).status()["reason"] == "IntegrityMismatch"


def test_an_entry_of_a_running_download_shows_its_bytes_and_source():
    item = full_item()
    running = SimpleNamespace(downloaded_bytes=999, source_bytes={"hub": 10, "node-b": 5})
    entry = entry_of(item, running)
    assert (entry.state, entry.downloaded_bytes, entry.source, entry.reason) == (DOWNLOADING, 300, SOURCE_HUB, None)
    by_peers = entry_of(item, SimpleNamespace(downloaded_bytes=40, source_bytes={"hub": 10, "node-b": 11}))
    assert (by_peers.downloaded_bytes, by_peers.source) == (40, SOURCE_PEER)


@pytest.mark.parametrize(
    "wanted, removal, pinned, collect",
    [
        (Wanted(digest(1), pinned=True), None, True, None),
        # unreferenced in spec.models: when the node removes it (its collectTime plus the node's delay)
        (Wanted(digest(1), referenced=False, collect_time=NOW + 3600), NOW + 3660, False, NOW + 3660),
        (None, NOW + 60, False, NOW + 60),  # out of spec.models: when it is removed
    ],
)
def test_an_entry_says_whether_it_is_pinned_and_when_it_is_collected(wanted, removal, pinned, collect):
    entry = entry_of(Item(digest(1), state=READY, size=1, downloaded=1), None, wanted, removal)
    assert (entry.pinned, entry.collect_time) == (pinned, collect)
    status = entry.status()
    assert status.get("pinned") == (True if pinned else None)
    assert status.get("collectTime") == rfc3339(collect)
    if collect is not None:
        assert status["collectTime"].endswith("Z")
