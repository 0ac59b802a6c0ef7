"""The node's downloads: at most one ``Download`` per digest, each run by its own thread.

``Jobs.ensure(ticket)`` decides what a referenced digest needs: a published tree is ``Ready`` at once
(no request made; its last use noted); a running download is left running; a digest that failed waits
for its ``retryTime`` unless forced; otherwise its download starts (a ticket that is not valid is
recorded ``Failed`` instead). A started download first reserves its remaining bytes under the volume's
high watermark, beside what the other running downloads still have to write (``capacity``: what may be
evicted goes when that makes it fit; else it fails with ``InsufficientCapacity``), then runs.

How it ended is recorded (``Outcomes``): ``Ready`` (failures forgotten, last use now, ``Hub`` or
``Peer`` by where most bytes came from); ``Failed`` with the reason and the next ``retryTime`` of the
backoff (none after a cancel: the caller's decision, not the hub's fault); or, stopped by shutdown or
removal, still ``Downloading`` on disk, resumed when asked again. A download that stops early leaves
its partial work for the next attempt.

Every download shares the node's limits (connections, bytes per second), the sources that failed lately
(``penalties``) and, when the glue gives one, the fan-out to the tickets' peers (``peering``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpustack_models.plugin.engine.capacity import Capacity, Retention
from gpustack_models.plugin.engine.disk import DiskError, disk_failure
from gpustack_models.plugin.engine.download import Download, DownloadSettings, Limits
from gpustack_models.plugin.engine.failures import (
    CANCELED,
    INSUFFICIENT_CAPACITY,
    INVALID_REQUEST,
    SOURCE_UNAVAILABLE,
    DownloadFailed,
    SourcePenalties,
    backoff_seconds,
)
from gpustack_models.plugin.engine.peering import FanOutFactory
from gpustack_models.plugin.engine.records import DOWNLOADING, FAILED, READY, Entry, Item, Records, source_of
from gpustack_models.plugin.engine.ticket import FetchTicket, digest_hex

# The states and the entry, for callers that import them from here.
__all__ = ["DOWNLOADING", "FAILED", "READY", "Entry", "Job", "Jobs", "Outcomes"]

log = logging.getLogger(__name__)


def _by_source(by_source: dict[str, int]) -> str:
    peers = sorted((n, b) for n, b in by_source.items() if n != "hub")
    listed = ", ".join(f"{node} {n}" for node, n in peers)
    return f"hub {by_source.get('hub', 0)}" + (f", peers {sum(b for _, b in peers)} ({listed})" if peers else "")


def _log_finished(digest: str, failure: DownloadFailed | None, stats: dict, seconds: float) -> None:
    log.info(
        "download %s %s: %d bytes fetched in %.1f s (%.1f MB/s), %d requests, %d retries, %d bytes resumed,"
        " %d bytes linked; bytes by source: %s%s",
        digest[:19],
        "ready" if failure is None else f"failed ({failure})",
        stats["network_bytes"],
        seconds,
        stats["network_bytes"] / max(seconds, 1e-6) / 1e6,
        stats["requests"],
        stats["retries"],
        stats["resumed_bytes"],
        stats["linked_bytes"],
        _by_source(stats.get("by_source") or {}),
        f"; banned peers: {', '.join(stats['banned'])}" if stats.get("banned") else "",
    )


RATE_WINDOW = 10.0  # seconds of received bytes the live rate is measured over


class Rate:
    """Bytes per second over about the last ``RATE_WINDOW`` seconds, measured from the samples taken when
    asked (the first ask only takes one, so bytes found on disk at the start never count as speed): what
    ``progress`` shows beside the bytes, and its ETA."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._samples: list[tuple[float, int]] = []
        self._lock = threading.Lock()

    def __call__(self, done: int) -> int:
        now = self._clock()
        with self._lock:
            samples = self._samples
            while len(samples) > 1 and now - samples[1][0] >= RATE_WINDOW:
                samples.pop(0)
            since, then = samples[0] if samples else (now, done)
            samples.append((now, done))
        return int(max(0, done - then) / (now - since)) if now - since >= 0.5 else 0


@dataclass
class Job:
    """One running download: its thread, whether its bytes are reserved, whether it stops for good."""

    download: Download
    thread: threading.Thread | None = None
    reserved: bool = False
    shutdown: bool = False  # stopped by shutdown or removal: stays Downloading, resumable
    done: threading.Event = field(default_factory=threading.Event)
    rate: Rate = field(default_factory=Rate)

    def stop(self, why: str, *, shutdown: bool = False) -> None:
        """Cancel the download; ``shutdown``: for good (it stays ``Downloading`` on disk, resumable)."""
        if shutdown:
            self.shutdown = True
        self.download.cancel(why)

    def progress(self, digest: str) -> dict:
        """What ``running()`` says of it."""
        download = self.download
        return {
            "digest": digest,
            "downloadedBytes": download.downloaded_bytes,
            "sizeBytes": download.size,
            "source": source_of(download.source_bytes),
            "bytesPerSecond": self.rate(download.downloaded_bytes),
        }

    def finished(self, seconds: float) -> dict:
        """The download's counters once it ended after ``seconds``, with its bytes by source."""
        download = self.download
        stats = dict(download.stats, seconds=round(seconds, 3), by_source=download.source_bytes)
        if download.fanout is not None:
            stats["banned"] = download.fanout.banned()
        return stats


class Outcomes:
    """How the end of a download is recorded on its item (see the module's docstring): ``retry_base`` is
    the backoff's first wait, ``metrics`` counts the ends. Caller holds the engine's lock."""

    def __init__(self, records: Records, retry_base: float, metrics=None):
        self._records = records
        self._retry_base = float(retry_base)
        self._metrics = metrics

    def settle(self, item: Item, job: Job, failure: DownloadFailed | None, now: float) -> None:
        """Record how the download of ``item`` ended (``failure``, or ``None`` once published)."""
        item.downloaded = job.download.downloaded_bytes
        if failure is None:
            item.state, item.downloaded = READY, item.size
            item.source = source_of(job.download.source_bytes)
            item.failures, item.reason, item.message, item.retry_time = 0, None, None, None
            self._records.touch(item, now, persist=True)
            if self._metrics is not None:
                self._metrics.download_finished(READY, None)
        elif job.shutdown:
            self._records.persist(item)  # stays Downloading: resumed when asked again
        else:
            self.failed(item, failure, now)
        if item.state != READY:
            self._records.set_aside(item.digest)

    def failed(self, item: Item, failure: DownloadFailed, now: float) -> None:
        """``item`` failed at ``now``: ``Failed`` with the reason, and the next retry of the backoff."""
        item.state, item.reason, item.message = FAILED, failure.reason, failure.message[:1024]
        if failure.reason == CANCELED:
            item.retry_time = None  # the caller's decision, not the hub's fault: no backoff
        else:
            item.failures += 1
            item.retry_time = now + backoff_seconds(item.failures, failure.retry_after, self._retry_base)
        self._records.persist(item)
        if self._metrics is not None:
            self._metrics.download_finished(FAILED, failure.reason)


class Jobs:
    """The downloads of the node (see the module's docstring). Thread-safe: ``lock`` is the engine's.

    ``view(item)`` is the entry of an item (caller holds the lock); ``emit(digest)`` tells the glue of a
    change (called outside the lock). ``clock``: epoch seconds; ``retry_base``: the backoff's first wait.
    Every download shares ``limits``, ``settings``, ``penalties`` and ``fan_out``; ``metrics`` counts them."""

    def __init__(
        self,
        records: Records,
        retention: Retention,
        capacity: Capacity,
        *,
        lock: threading.RLock,
        view: Callable[[Item], Entry],
        emit: Callable[[str], None],
        clock: Callable[[], float],
        retry_base: float,
        limits: Limits,
        settings: DownloadSettings,
        penalties: SourcePenalties,
        fan_out: FanOutFactory | None = None,
        metrics=None,
    ):
        self._records, self._retention, self._capacity = records, retention, capacity
        self._outcomes = Outcomes(records, retry_base, metrics)
        self._cache = records.cache
        self._limits, self._settings, self._penalties, self._fan_out = limits, settings, penalties, fan_out
        self._metrics = metrics
        self._lock = lock
        self._view, self._emit = view, emit
        self._clock = clock
        self._jobs: dict[str, Job] = {}
        self._closed = False

    # ---------------------------------------------------------------- reads

    def downloads(self) -> dict[str, Download]:
        """The running downloads by digest. Caller holds the lock."""
        return {digest: job.download for digest, job in self._jobs.items()}

    def _entry(self, digest: str) -> Entry | None:
        with self._lock:
            item = self._records.get(digest)
            return self._view(item) if item is not None else None

    def running(self) -> list[dict]:
        """The downloads in progress: ``digest, downloadedBytes, sizeBytes, source, bytesPerSecond``."""
        with self._lock:
            jobs = list(self._jobs.items())
        return [job.progress(digest) for digest, job in sorted(jobs)]

    def written(self, digest: str) -> list[tuple[str, int, list[list[int]]]] | None:
        """``Download.written`` of the running download of ``digest``, or ``None``."""
        with self._lock:
            job = self._jobs.get(digest)
        return job.download.written() if job is not None else None

    def stats(self, digest: str) -> dict | None:
        """Counters of the running or last download of ``digest`` in this process."""
        with self._lock:
            job = self._jobs.get(digest)
            if job is not None:
                return dict(job.download.stats)
            stats = self._records.last_stats.get(digest)
            return dict(stats) if stats is not None else None

    # ---------------------------------------------------------------- ensure

    def ensure(self, ticket: FetchTicket, *, force: bool = False) -> Entry | None:
        """Make sure ``ticket.digest`` is on the node (see the module's docstring); its entry. A digest the
        known spec does not reference is left as it is (its entry, or ``None``). A digest that is not
        ``sha256:<hex>`` raises ``DownloadFailed(InvalidRequest)``."""
        digest = ticket.digest
        try:
            digest_hex(digest)
        except ValueError:
            raise DownloadFailed(INVALID_REQUEST, f"not a manifest digest: {digest!r}") from None
        now = self._clock()
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if not self._retention.referenced(digest):
                known = self._records.get(digest)
                return self._view(known) if known is not None else None
            item, changed = self._records.claim(digest)
            changed = self._act(item, ticket, now, force, changed)
            entry = self._view(item)
        if not changed:
            return entry
        self._emit(digest)
        return self._entry(digest)

    def _act(self, item: Item, ticket: FetchTicket, now: float, force: bool, changed: bool) -> bool:
        """Note a published tree, leave a running or backing-off digest, or start (or refuse) its download;
        True when the glue is to hear of it. Caller holds the lock."""
        if self._cache.published(item.digest) and item.digest not in self._jobs:
            changed = self._records.found_published(item) or changed
            self._records.touch(item, now, persist=changed)
            return changed
        if item.digest in self._jobs or self._backing_off(item, now, force):
            if changed:
                self._records.persist(item)
            return False
        try:
            ticket.validate()
        except DownloadFailed as failure:
            self._outcomes.failed(item, failure, now)
        else:
            self._start(item, ticket)
        return True

    @staticmethod
    def _backing_off(item: Item, now: float, force: bool) -> bool:
        return item.state == FAILED and item.retry_time is not None and now < item.retry_time and not force

    def _start(self, item: Item, ticket: FetchTicket) -> None:
        """Caller holds the lock."""
        download = Download(
            ticket,
            self._cache,
            self._limits,
            self._settings,
            on_bytes=self._count_bytes,
            penalties=self._penalties,
            fan_out=self._fan_out,
            on_peer_bytes=self._count_peer_bytes,
            layers_first=item.failures > 0,  # a compressed layer's file no peer served: read the layer now
        )
        job = Job(download)
        self._jobs[item.digest] = job
        self._records.idle_partial.pop(item.digest, None)
        item.state, item.size = DOWNLOADING, ticket.size
        item.reason = item.message = None
        self._records.persist(item)
        job.thread = threading.Thread(
            target=self._run, args=(item.digest, job), name=f"fetch-{ticket.hex[:12]}", daemon=True
        )
        job.thread.start()

    def _count_bytes(self, n: int) -> None:
        if self._metrics is not None:
            self._metrics.bytes_downloaded(n)

    def _count_peer_bytes(self, node: str, n: int) -> None:
        if self._metrics is not None:
            self._metrics.bytes_from_peer(node, n)

    # ---------------------------------------------------------------- run (the job's thread)

    def _run(self, digest: str, job: Job) -> None:
        started = time.monotonic()
        failure = self._download(digest, job)
        now = self._clock()
        seconds = time.monotonic() - started
        stats = job.finished(seconds)
        _log_finished(digest, failure, stats, seconds)
        if self._metrics is not None and stats["linked_bytes"]:
            self._metrics.bytes_linked(stats["linked_bytes"])
        with self._lock:
            self._records.last_stats[digest] = stats
            item = self._records.get(digest)
            self._jobs.pop(digest, None)
            if item is not None:
                self._outcomes.settle(item, job, failure, now)
        job.done.set()
        if not job.shutdown:
            self._emit(digest)

    def _download(self, digest: str, job: Job) -> DownloadFailed | None:
        """Reserve the capacity and run the download; its failure, or ``None`` once published."""
        try:
            try:
                job.download.prepare()
            except (DiskError, OSError) as exc:
                raise disk_failure(exc) from None
            if self._metrics is not None:
                self._metrics.bytes_resumed(job.download.stats["resumed_bytes"])
            self._reserve(digest, job)
            job.download.run()
        except DownloadFailed as exc:
            return exc
        except Exception as exc:  # never leave a digest stuck in Downloading
            log.exception("download of %s crashed", digest)
            return DownloadFailed(SOURCE_UNAVAILABLE, f"unexpected error: {type(exc).__name__}: {exc}")
        return None

    def _reserve(self, digest: str, job: Job) -> None:
        """Refuse the download unless its remaining bytes fit under the high watermark beside what every
        other running download still has to write (``Capacity.reserve``)."""
        with self._lock:
            remaining = job.download.remaining_bytes
            others = sum(j.download.remaining_bytes for d, j in self._jobs.items() if d != digest and j.reserved)
            evicted, shortfall = self._capacity.reserve(digest, remaining, others)
            job.reserved = shortfall is None
        for gone in evicted:
            self._emit(gone)
        if shortfall is not None:
            raise DownloadFailed(INSUFFICIENT_CAPACITY, shortfall)

    # ---------------------------------------------------------------- stopping

    def cancel(self, digest: str, *, wait: float | None = None) -> bool:
        """Stop the running download of ``digest`` (recorded ``Failed``/``Canceled``, its partial work kept);
        True if one was running. ``wait``: seconds to wait for it."""
        with self._lock:
            job = self._jobs.get(digest)
        if job is None:
            return False
        job.stop("cancelled by the node's plugin")
        if wait:
            job.done.wait(wait)
        return True

    def wait(self, digest: str, timeout: float | None = None) -> Entry | None:
        """Wait until ``digest`` is not downloading any more (or ``timeout``); its entry."""
        with self._lock:
            job = self._jobs.get(digest)
        if job is not None:
            job.done.wait(timeout)
        return self._entry(digest)

    def stop_unreferenced(self) -> None:
        """Stop the running download of each digest no longer referenced (its partial work kept)."""
        with self._lock:
            referenced = self._retention.referenced
            stopping = [j for d, j in self._jobs.items() if not referenced(d) and not j.download.cancelled]
        for job in stopping:
            log.info("stopping the download of %s: no longer referenced on this node", job.download.digest[:19])
            job.stop("no longer referenced on this node; the bytes downloaded are kept")

    def stop(self, digest: str, why: str, timeout: float) -> None:
        """Stop the running download of ``digest`` for good (it stays ``Downloading`` on disk), waiting at
        most ``timeout`` seconds for it."""
        with self._lock:
            job = self._jobs.get(digest)
        if job is not None:
            job.stop(why, shutdown=True)
            job.done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Stop every running download, keeping it resumable (it stays ``Downloading`` on disk); no new one
        starts."""
        with self._lock:
            self._closed = True
            jobs = list(self._jobs.values())
        for job in jobs:
            job.stop("the plugin is stopping", shutdown=True)
        deadline = time.monotonic() + timeout
        for job in jobs:
            job.done.wait(max(0.0, deadline - time.monotonic()))
