"""What the engine knows of each digest, and the records on disk that keep it across restarts.

``Item`` is the engine's knowledge of one digest: its state, sizes, failure count and retry time, last
use, since when it is out of ``spec.models``, and where most of its bytes came from. ``Item.record()`` is
what is saved per digest (``Cache.record_path``), replaced atomically on every change.

``Records`` holds the items of the node. At start (``load``) it finds them on disk: a published tree is
``Ready`` (its record or not; a failure recorded before it was published is forgotten), partial work is
``Downloading`` (or still ``Failed``) with the progress of its checkpoint, a record whose tree is gone is
deleted, and partial work left beside a published tree (a crash right after publishing) is removed.
It also keeps, per digest, the bytes of partial work no download is running on (``idle_partial``) and
the counters of the last download in this process (``last_stats``).

``Entry`` is what the glue reports of a digest (a NodeModelStore ``status.models`` item); ``entry_of``
builds it from an item, its running download and its ``spec.models`` item.

``Records`` takes no lock: the engine calls it with its lock held.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from gpustack_models.kinds import nodemodelstore
from gpustack_models.plugin.engine.cache import Cache, read_json
from gpustack_models.plugin.engine.checkpoint import CHECKPOINT_VERSION
from gpustack_models.plugin.engine.lifecycle import Wanted

log = logging.getLogger(__name__)

# The states of a digest on a node, as the NodeModelStore reports them (the one definition of the kind).
DOWNLOADING, READY, FAILED = nodemodelstore.DOWNLOADING, nodemodelstore.READY, nodemodelstore.FAILED
SOURCE_HUB, SOURCE_PEER = nodemodelstore.SOURCE_HUB, nodemodelstore.SOURCE_PEER
TOUCH_PERSIST_SECONDS = 60.0  # a tree's last use is saved at most this often (unless asked to save it)


def source_of(by_source: dict[str, int]) -> str:
    """``Peer`` when most bytes received came from peers, else ``Hub``."""
    hub = by_source.get("hub", 0)
    return SOURCE_PEER if sum(by_source.values()) - hub > hub else SOURCE_HUB


def rfc3339(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(int(epoch), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Entry:
    """What the node holds or works on for one digest (a NodeModelStore ``status.models`` item)."""

    digest: str
    state: str  # Downloading | Ready | Failed
    size_bytes: int
    downloaded_bytes: int
    reason: str | None = None
    message: str | None = None
    retry_time: float | None = None  # epoch seconds
    last_used_time: float | None = None  # epoch seconds
    source: str = SOURCE_HUB
    pinned: bool = False
    collect_time: float | None = None  # epoch seconds: when the node removes it unless referenced again

    def status(self) -> dict:
        """The status item: camelCase keys, RFC 3339 times, absent fields left out. A ``Failed`` item's
        reason is one of the kind's fixed reasons (``Unknown`` for any other: kube-apiserver would refuse
        the whole status write for it); any other item has none."""
        failed = self.state == FAILED
        out = {
            "digest": self.digest,
            "state": self.state,
            "sizeBytes": self.size_bytes,
            "downloadedBytes": self.downloaded_bytes,
            "reason": nodemodelstore.failure_reason(self.reason) if failed else None,
            "message": self.message,
            "retryTime": rfc3339(self.retry_time),
            "lastUsedTime": rfc3339(self.last_used_time),
            "source": self.source,
            "pinned": True if self.pinned else None,
            "collectTime": rfc3339(self.collect_time),
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass
class Item:
    """The engine's knowledge of one digest; ``record()`` is what is persisted."""

    digest: str
    state: str | None = None
    size: int = 0
    downloaded: int = 0
    failures: int = 0
    reason: str | None = None
    message: str | None = None
    retry_time: float | None = None
    last_used: float | None = None
    last_used_saved: float | None = None
    absent_since: float | None = None
    # The collectTime its spec.models item announced while unreferenced (epoch seconds): the node's removal
    # delay runs from it once the digest leaves the spec, so the removal time shown never moves.
    collect_time: float | None = None
    source: str = SOURCE_HUB

    def record(self) -> dict:
        return {
            "digest": self.digest,
            "state": self.state,
            "sizeBytes": self.size,
            "downloadedBytes": self.downloaded,
            "failures": self.failures,
            "reason": self.reason,
            "message": self.message,
            "retryTime": self.retry_time,
            "lastUsedTime": self.last_used,
            "absentSince": self.absent_since,
            "collectTime": self.collect_time,
            "source": self.source,
        }

    @classmethod
    def from_record(cls, digest: str, record: dict) -> Item:
        """The item a saved ``record`` describes; a field of the wrong type reads as unset."""

        def number(key):
            value = record.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        def integer(key):
            value = record.get(key)
            return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

        def text(key):
            value = record.get(key)
            return value if isinstance(value, str) else None

        item = cls(digest)
        item.state = text("state") if record.get("state") in (DOWNLOADING, READY, FAILED) else None
        item.size = integer("sizeBytes")
        item.downloaded = integer("downloadedBytes")
        item.failures = integer("failures")
        item.reason, item.message = text("reason"), text("message")
        item.retry_time = number("retryTime")
        item.last_used = item.last_used_saved = number("lastUsedTime")
        item.absent_since = number("absentSince")
        item.collect_time = number("collectTime")
        item.source = SOURCE_PEER if record.get("source") == SOURCE_PEER else SOURCE_HUB
        return item


class Progress(Protocol):
    """What an entry shows of a running download (``download.Download``)."""

    @property
    def downloaded_bytes(self) -> int: ...

    @property
    def source_bytes(self) -> dict[str, int]: ...


def entry_of(
    item: Item, running: Progress | None = None, wanted: Wanted | None = None, removal_time: float | None = None
) -> Entry:
    """The entry of ``item``: ``Downloading`` with the bytes so far while ``running`` (its download) runs;
    the failure only when ``Failed``; ``pinned`` from its ``spec.models`` item ``wanted``; ``collectTime``
    its ``removal_time`` (when the node removes it unless referenced again)."""
    downloaded = running.downloaded_bytes if running is not None else item.downloaded
    state = DOWNLOADING if running is not None else item.state
    source = source_of(running.source_bytes) if running is not None else item.source
    failed = state == FAILED
    return Entry(
        digest=item.digest,
        state=state,
        size_bytes=item.size,
        downloaded_bytes=min(downloaded, item.size) if item.size else downloaded,
        reason=item.reason if failed else None,
        message=item.message if failed else None,
        retry_time=item.retry_time if failed else None,
        last_used_time=item.last_used,
        source=source,
        pinned=wanted is not None and wanted.pinned,
        collect_time=removal_time,
    )


def checkpoint_progress(path: Path) -> tuple[int, int]:
    """``(size, bytes hashed)`` of the download whose checkpoint is at ``path``; ``(0, 0)`` without one."""
    document = read_json(path)
    if not isinstance(document, dict) or document.get("version") != CHECKPOINT_VERSION:
        return 0, 0
    size = downloaded = 0
    for entry in (document.get("files") or {}).values():
        if not isinstance(entry, dict):
            continue
        file_size = entry.get("size") if isinstance(entry.get("size"), int) else 0
        size += file_size
        if entry.get("verified"):
            downloaded += file_size
        elif isinstance(entry.get("hashed"), int):
            downloaded += entry["hashed"]
    return size, downloaded


class Records:
    """The items of the node's digests and their records in ``cache`` (see the module's docstring)."""

    def __init__(self, cache: Cache):
        self.cache = cache
        self.items: dict[str, Item] = {}
        self.idle_partial: dict[str, int] = {}  # bytes on disk of partial work not running now
        self.last_stats: dict[str, dict] = {}  # counters of each digest's last download in this process

    def load(self) -> None:
        """Find the digests the cache holds (published trees, partial work, records); save what changed."""
        cache = self.cache
        published = set(cache.published_digests())
        partial = set(cache.partial_digests())
        for digest in partial & published:
            cache.remove_partial(digest)  # left over from a crash right after publishing
        partial -= published
        for digest in sorted(set(cache.recorded_digests()) | published | partial):
            record = cache.load_record(digest)
            item = Item.from_record(digest, record) if record else Item(digest)
            if not self._found(item, digest in published, digest in partial):
                cache.delete_record(digest)  # the tree is gone: nothing left to report
                continue
            self.items[digest] = item
            if record != item.record():
                self.persist(item)

    def _found(self, item: Item, published: bool, partial: bool) -> bool:
        """Make ``item`` say what the disk holds of it; False when nothing is left to report."""
        if published:
            if item.state != READY or not item.size:
                item.size = self.cache.tree_size(item.digest)
            item.state, item.downloaded = READY, item.size
            item.reason = item.message = None
            item.retry_time, item.failures = None, 0
        elif partial:
            size, downloaded = checkpoint_progress(self.cache.checkpoint_path(item.digest))
            item.size = size or item.size
            item.downloaded = downloaded
            if item.state not in (DOWNLOADING, FAILED):
                item.state = DOWNLOADING
            self.idle_partial[item.digest] = self.cache.partial_bytes(item.digest)
        elif item.state == READY or item.state is None:
            return False
        else:
            item.downloaded = 0
        return True

    def get(self, digest: str) -> Item | None:
        return self.items.get(digest)

    def claim(self, digest: str) -> tuple[Item, bool]:
        """The item of ``digest`` (created if new), no longer absent; True if that changed it."""
        item = self.items.get(digest)
        if item is None:
            item = self.items[digest] = Item(digest)
        if item.absent_since is None:
            return item, False
        item.absent_since = None
        return item, True

    def found_published(self, item: Item) -> bool:
        """``item``'s tree is published: ``Ready`` with the tree's size; True if that changed it."""
        if item.state == READY:
            return False
        item.state, item.size = READY, self.cache.tree_size(item.digest)
        item.downloaded = item.size
        return True

    def persist(self, item: Item) -> None:
        """Save ``item``'s record (a failure to write it is logged: the item stays as it is in memory)."""
        try:
            self.cache.save_record(item.digest, item.record())
            item.last_used_saved = item.last_used
        except OSError:
            log.exception("cannot save the state of %s", item.digest)

    def touch(self, item: Item, now: float, *, persist: bool = False) -> None:
        """Note that ``item``'s tree was used at ``now``, saved if ``persist`` or the last save is old."""
        item.last_used = now
        if persist or item.last_used_saved is None or now - item.last_used_saved >= TOUCH_PERSIST_SECONDS:
            self.persist(item)

    def set_aside(self, digest: str) -> None:
        """No download runs for ``digest`` any more: count the partial work it left, if any."""
        if self.cache.partial(digest).exists():
            self.idle_partial[digest] = self.cache.partial_bytes(digest)

    def remove(self, digest: str) -> None:
        """Delete ``digest`` from the node: its tree, partial work and record, and what is known of it."""
        self.cache.remove(digest)
        self.cache.delete_record(digest)
        self.items.pop(digest, None)
        self.idle_partial.pop(digest, None)
        self.last_stats.pop(digest, None)
