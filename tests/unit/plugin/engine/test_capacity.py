"""Capacity and retention on their own, on a small cache volume: the watermarks, the bytes counted, the
eviction order (pinned, referenced, mounted and running digests never go; the least recently used
first), room made for a download, and when what left ``spec.models`` is removed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.capacity import Capacity, Retention, check_watermarks
from gpustack_models.plugin.engine.records import DOWNLOADING, FAILED, Records

NOW = 1_700_000_000.0
VOLUME = 1000  # bytes: one 100-byte tree is 10 % of it
DELAY, RETENTION = 60.0, 3600.0


def digest(name: str) -> str:
    return "sha256:" + name.encode().hex().ljust(64, "0")


class Node:
    """A cache of ``VOLUME`` bytes with its record store, retention and capacity; ``running`` stands for
    the running downloads by digest."""

    def __init__(self, root, high=80.0, low=70.0):
        self.cache = Cache(root, capacity_bytes=VOLUME)
        self.records = Records(self.cache)
        self.running: dict[str, SimpleNamespace] = {}
        self.retention = Retention(self.records, self.downloads, removal_delay=DELAY, partial_retention=RETENTION)
        self.capacity = Capacity(self.cache, self.retention, self.downloads, high_percent=high, low_percent=low)

    def downloads(self):
        return self.running

    def tree(self, name: str, size: int = 100, last_used: float | None = None) -> str:
        """A published tree of ``size`` bytes, last used at ``last_used``."""
        d = digest(name)
        tree = self.cache.partial_tree(d)
        tree.mkdir(parents=True)
        (tree / "model.bin").write_bytes(name.encode()[:1] * size)
        self.cache.publish(d)
        item, _ = self.records.claim(d)
        self.records.found_published(item)
        item.last_used = last_used
        return d

    def partial(self, name: str, size: int = 100) -> str:
        """Partial work no download runs on."""
        d = digest(name)
        self.cache.partial_tree(d).mkdir(parents=True)
        (self.cache.partial_tree(d) / "model.bin").write_bytes(b"p" * size)
        item, _ = self.records.claim(d)
        item.state = FAILED
        self.records.set_aside(d)
        return d

    def download(self, name: str, size: int, written: int, linked: int = 0) -> str:
        d = digest(name)
        item, _ = self.records.claim(d)
        item.state, item.size = DOWNLOADING, size
        self.running[d] = SimpleNamespace(size=size, remaining_bytes=size - written - linked, linked_bytes=linked)
        return d

    def want(self, *items: dict, now: float = NOW) -> None:
        self.retention.set_wanted(list(items), now)

    def held(self) -> set[str]:
        return set(self.records.items)


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


@pytest.mark.parametrize("high, low", [(80, 90), (0, 0), (101, 50), (50, 0), (-1, -2)])
def test_it_refuses_watermarks_out_of_order(node, high, low):
    with pytest.raises(ValueError):
        check_watermarks(high, low)
    with pytest.raises(ValueError):
        node.capacity.set_watermarks(high, low)
    assert (node.capacity.high, node.capacity.low) == (80, 70)


def test_it_counts_shared_files_once_partial_work_and_what_running_downloads_wrote(node):
    node.tree("a", 100)
    shared = node.tree("b", 50)
    (node.cache.tree(shared) / "same.bin").hardlink_to(node.cache.tree(digest("a")) / "model.bin")
    node.cache.shared.add(shared, node.cache.tree(shared), None)  # counted again after the link
    node.partial("p", 30)
    node.download("r", size=400, written=70, linked=100)  # what it linked is the trees' bytes

    assert node.capacity.stored_bytes() == 100 + 50 + node.records.idle_partial[digest("p")] + 70
    assert node.records.idle_partial[digest("p")] == node.cache.partial_bytes(digest("p")) > 0


def test_it_says_room_is_low_from_the_high_watermark_until_back_at_the_low_one(node):
    def report(stored):
        result = node.capacity.report(stored)
        return result["usedPercent"], node.capacity.low_on_room

    assert node.capacity.report(250) == {"totalBytes": VOLUME, "storedBytes": 250, "usedPercent": 25}
    assert report(750) == (75, False)
    assert report(800) == (80, True)
    assert report(750) == (75, True)  # between the watermarks: still low
    assert report(700) == (70, False)
    assert report(750) == (75, False)


def test_it_evicts_neither_pinned_referenced_mounted_nor_running_digests_and_the_least_recently_used_first(node):
    for name, used in [("pinned", 1), ("referenced", 2), ("mounted", 3), ("used-late", 50), ("used-early", 10)]:
        node.tree(name, last_used=NOW + used)
    never = node.tree("never-used")
    unreferenced = node.tree("unreferenced", last_used=NOW + 20)
    in_spec_partial = node.partial("in-spec-partial")
    out_partial = node.partial("out-partial")
    node.download("running", size=100, written=50)
    assert node.retention.evictable() == []  # the spec is not known yet

    node.want(
        {"digest": digest("pinned"), "pinned": True, "collectTime": "2030-01-01T00:00:00Z"},
        {"digest": digest("referenced")},
        {"digest": digest("unreferenced"), "collectTime": "2030-01-01T00:00:00Z"},
        {"digest": in_spec_partial, "collectTime": "2030-01-01T00:00:00Z"},
    )
    node.retention.set_mounted([digest("mounted")], NOW)

    order = [item.digest for item in node.retention.evictable()]
    # Never used (the tree, and the partial work) first, by digest; then by last use.
    assert order == [never, out_partial, digest("used-early"), unreferenced, digest("used-late")]


def test_it_relieves_pressure_down_to_the_low_watermark_only(node):
    trees = [node.tree(f"t{i}", last_used=NOW + i) for i in range(7)]  # 70 %
    node.want()
    assert node.capacity.relieve_pressure() == []  # under the high watermark

    node.capacity.set_watermarks(60, 45)
    assert node.capacity.relieve_pressure() == trees[:3]  # 70 -> 40 %: three go, oldest use first
    assert node.held() == set(trees[3:]) and all(node.cache.published(d) for d in trees[3:])
    assert not node.cache.published(trees[0]) and not node.cache.record_path(trees[0]).exists()
    assert node.capacity.relieve_pressure() == []


def test_it_makes_room_for_a_download_only_when_eviction_can_free_enough(node):
    old, newer = node.tree("old", last_used=NOW), node.tree("newer", last_used=NOW + 1)
    kept = node.tree("kept", 300)
    node.want({"digest": kept})  # 50 % used; the high watermark (80 %) leaves 300 bytes

    evicted, shortfall = node.capacity.reserve(digest("big"), remaining=600, others=0)
    assert evicted == [] and node.held() == {old, newer, kept}  # freeing 200 bytes would not do
    assert shortfall.startswith("needs 600 more bytes, 300 bytes are free under the volume's 80% watermark")
    assert "(500 of 1000 bytes used, 0 reserved by other downloads)" in shortfall

    evicted, shortfall = node.capacity.reserve(digest("big"), remaining=300, others=100)
    assert evicted == [old] and shortfall is None and node.held() == {newer, kept}

    evicted, shortfall = node.capacity.reserve(digest("small"), remaining=300, others=100)
    assert evicted == [] and shortfall is None  # it fits as it is


def test_it_removes_what_left_the_spec_after_its_delay_and_partial_work_after_its_retention(node):
    tree, work, back = node.tree("tree"), node.partial("work"), node.tree("back")
    running = node.download("running", size=100, written=10)
    assert node.capacity.collect(NOW + 10 * RETENTION) == []  # nothing before the spec is known

    node.want({"digest": back}, now=NOW)
    entries = {d: node.retention.removal_time(node.records.get(d)) for d in (tree, work, running, back)}
    assert entries == {tree: NOW + DELAY, work: NOW + RETENTION, running: NOW + RETENTION, back: None}
    assert node.capacity.collect(NOW + DELAY - 1) == []
    node.want(now=NOW + DELAY - 1)  # back left too: its delay counts from now, the others' from NOW
    assert node.capacity.collect(NOW + DELAY) == [tree]
    assert node.capacity.collect(NOW + 2 * DELAY - 1) == [back]
    assert node.capacity.collect(NOW + RETENTION) == [work]  # the running download's partial work stays
    assert node.held() == {running} and not node.cache.partial(work).exists()


def test_it_keeps_a_mounted_digest_and_counts_its_delay_from_its_unmounting(node):
    mounted = node.tree("mounted", last_used=NOW)
    node.retention.set_mounted([mounted], NOW)
    node.want(now=NOW)
    assert node.retention.referenced(mounted) and node.retention.removal_time(node.records.get(mounted)) is None
    assert node.capacity.collect(NOW + DELAY) == []

    node.retention.set_mounted([], NOW + 100)
    assert node.records.get(mounted).absent_since == NOW + 100
    assert node.capacity.collect(NOW + 100 + DELAY - 1) == []
    assert node.capacity.collect(NOW + 100 + DELAY) == [mounted]


def test_the_absence_of_a_digest_survives_a_restart(node, tmp_path):
    gone = node.tree("gone")
    node.records.persist(node.records.get(gone))
    node.want(now=NOW)

    restarted = Node(tmp_path)
    restarted.records.load()
    restarted.want(now=NOW + DELAY - 1)  # not reset by the restart
    assert restarted.capacity.collect(NOW + DELAY - 1) == []
    assert restarted.capacity.collect(NOW + DELAY) == [gone]


def test_it_touches_mounted_ready_trees_not_used_for_an_interval(node):
    recent, stale = node.tree("recent", last_used=NOW), node.tree("stale", last_used=NOW - 100)
    never, partial = node.tree("never"), node.partial("partial")
    node.retention.set_mounted([recent, stale, never, partial], NOW)

    assert node.retention.touch_mounted(NOW + 30, interval=60) == sorted([stale, never])
    assert node.records.get(stale).last_used == NOW + 30 and node.records.get(recent).last_used == NOW
    assert node.cache.load_record(never)["lastUsedTime"] == NOW + 30
    assert node.records.get(partial).state == FAILED and node.records.get(partial).last_used is None
