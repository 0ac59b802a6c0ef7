"""A download's fetching when it may ask peers: the ``Board`` decides, this module carries it out.

``FanOut`` runs beside ``Download``: its fetching threads take ``(segment, source)`` from the board, fetch a
hub segment through the download's ``RangeFetcher`` (the ticket's hubs in their failover order) and
a peer segment through ``PeerClient``, and report back. A poller thread asks the Downloading peers
for the ranges they hold and the API for the ticket's current peers. A file that fails its hash
with bytes from peers is re-checked against a second source and only the peers whose bytes differ
are banned (``recover``, ``recheck``), or, when that cannot tell, thrown away and fetched again, every
peer that wrote to it banned; bytes by source are counted for the status (``Peer`` when most came
from peers), the metrics and the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpustack_models.plugin.engine.failures import INTEGRITY_MISMATCH, DownloadFailed
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.ticket import FetchTicket, usable_peers
from gpustack_models.plugin.peers.peer_client import (
    PeerAccess,
    PeerBusy,
    PeerClient,
    PeerError,
    PeerMissing,
    PeerRefused,
    Stale,
)
from gpustack_models.plugin.peers.recheck import Inconclusive, Recheck
from gpustack_models.plugin.peers.swarm import HUB, Board, Finished, Segment, SwarmSettings

log = logging.getLogger(__name__)


class FanOut:
    """The peers' side of one download (see the module's docstring)."""

    def __init__(
        self,
        ticket: FetchTicket,
        node: str,
        access: PeerAccess,
        download,
        settings: SwarmSettings | None = None,
        on_peer_bytes: Callable[[str, int], None] | None = None,
    ):
        self.ticket, self.node, self.access = ticket, node, access
        self.download = download
        self.settings = settings or SwarmSettings()
        self._on_peer_bytes = on_peer_bytes
        self.board: Board | None = None
        self.client: PeerClient | None = None
        self._sizes = {f.path: f.size for f in ticket.files}
        self._done = threading.Event()
        self._poller: threading.Thread | None = None
        self._recheck: Recheck | None = None
        self._recovering = threading.Lock()
        self._checking: set[FileProgress] = set()  # bad files being re-checked
        self._one_recheck = threading.Lock()  # one at a time: a second bad file waits for the first's

    # ---------------------------------------------------------------- lifecycle

    def open(self, files: list[FileProgress]) -> int:
        """Plan the segments of ``files``; the number of segments."""
        d = self.download
        peers = usable_peers(self.ticket.peers)
        self.board = Board(
            self.node,
            self.ticket.digest,
            files,
            self.settings,
            d.settings.part_size,
            total=self.ticket.size,
            split_threshold=d.settings.split_threshold,
            fine=bool(peers),
        )
        self.board.set_peers(peers)
        if self._settling(self.ticket.joining, peers):
            self.board.settle(self.settings.peer_settle)
        self.client = PeerClient(self.ticket.hex, self.access, d.settings.stall_timeout, d.limits.rate, d._frontier)
        self._recheck = Recheck(self.board, self.client, d._frontier, self._from_hubs, self._count, d._stop.is_set)
        self._poller = threading.Thread(target=self._poll, name=f"peers-{self.ticket.hex[:8]}", daemon=True)
        self._poller.start()
        return len(self.board.pending)

    def close(self) -> None:
        self._done.set()
        if self.board is not None:
            self.board.wake()
        if self._poller is not None:
            self._poller.join(timeout=10)
        if self.client is not None:
            self.client.close()

    def abort(self) -> None:
        if self.client is not None:
            self.client.abort()
        if self.board is not None:
            self.board.wake()

    def unfinished(self) -> bool:
        """Segments are left (a file thrown away after the fetching threads had finished)."""
        return self.board is not None and bool(self.board.pending or self.board.inflight)

    def peer_bytes(self) -> dict[str, int]:
        return self.board.peer_bytes() if self.board is not None else {}

    def banned(self) -> list[str]:
        return self.board.banned() if self.board is not None else []

    def _settling(self, joining: int | None, peers) -> bool:
        """Wait for nodes starting beside us before asking the hub: nobody holds the digest yet (no Ready
        peer) and the API knows of nodes starting on it that the ticket cannot list yet (``joining``; an
        API that does not say may have some). Each node's share of the hub's bytes is then computed over
        all of them. A node alone, or one whose ticket lists every node starting beside it, has nobody to
        wait for."""
        if self.access.refresh is None or any(p.state == "Ready" for p in peers):
            return False
        return joining is None or joining > 0

    # ---------------------------------------------------------------- the poller

    def _poll(self) -> None:
        settings = self.settings
        refresh_at = time.monotonic() + (settings.peer_poll if self.board.held() else settings.peer_refresh)
        while not self._done.wait(min(settings.peer_poll, max(0.05, refresh_at - time.monotonic()))):
            if self.access.refresh is not None and time.monotonic() >= refresh_at:
                self._refresh()
                # While the hub waits for nodes still joining, the ticket is asked again at every poll.
                held = self.board.held()
                refresh_at = time.monotonic() + (settings.peer_poll if held else settings.peer_refresh)
            for state in self.board.candidates():
                if self._done.is_set():
                    return
                try:
                    self.board.polled(state.node, *self.client.tree(state.peer, self._sizes))
                except PeerRefused as exc:
                    log.info("%s: peer %s refused its tree: %s", self.ticket.digest[:19], state.node, exc)
                    self.board.peer_failed(state.node, fatal=True)
                except PeerError:
                    self.board.peer_failed(state.node)

    def _refresh(self) -> None:
        try:
            ticket = self.access.refresh(self.ticket.digest)
        except Exception as exc:  # the API unreachable a moment: keep the peers known
            log.info("%s: the ticket's peers could not be read again: %s", self.ticket.digest[:19], exc)
            return
        if ticket is None:
            return
        peers = usable_peers(ticket.peers)
        self.board.set_peers(peers)
        if self.board.held() and not self._settling(ticket.joining, peers):
            self.board.release()  # every node that wants the digest is listed now

    # ---------------------------------------------------------------- fetching threads

    def work(self, view: memoryview) -> None:
        """A fetching thread: take segments and fetch them until none is left or the download stops."""
        d, board, slots = self.download, self.board, self.download.limits.slots
        while not d._stop.is_set():
            try:
                choice = board.take()
            except Finished:
                return
            if choice is None:
                board.wait(0.2)
                continue
            if not slots.acquire(d._stop.is_set):
                board.put_back(choice[0], 0, 0.0)
                return
            try:
                self._fetch(*choice, view)
            finally:
                slots.release()

    def _fetch(self, seg: Segment, source: str, view: memoryview) -> None:
        started = time.monotonic()
        try:
            if source == HUB:
                self._from_hub(seg, view, started)
            else:
                self._from_peer(seg, source, view, started)
        except DownloadFailed as exc:
            if not self.recover(exc, view):
                raise

    def _from_hubs(self, f: FileProgress, start: int, end: int, view: memoryview, sink) -> None:
        """``[start, end)`` of ``f`` from the ticket's hubs into ``sink`` (a re-check's second source)."""
        self.download._fetcher.fetch(f, start, end, view, None, sink)

    def _from_hub(self, seg: Segment, view: memoryview, started: float) -> None:
        try:
            self.download._fetcher.fetch(seg.f, seg.pos, seg.end, view, seg)  # fails when every hub failed
        except DownloadFailed:
            self.board.done(seg, 0, 0.0)
            raise
        moved, seg.pos = seg.end - seg.pos, seg.end
        self.board.done(seg, moved, time.monotonic() - started)

    def _from_peer(self, seg: Segment, node: str, view: memoryview, started: float) -> None:
        board, peer, start = self.board, self.board.peers[node], seg.pos
        try:
            self.client.fetch(seg, peer.peer, view, self.download._stop.is_set)
        except Stale:
            pass
        except PeerBusy as exc:
            board.peer_failed(node, busy=max(exc.retry_after, 0.1))
        except PeerMissing:
            board.forget(node, seg.f.file.path)
        except PeerRefused as exc:
            log.info("%s: peer %s refused %s: %s", self.ticket.digest[:19], node, seg.f.file.path, exc)
            board.peer_failed(node, fatal=True)
        except PeerError as exc:
            log.info("%s: peer %s failed: %s", self.ticket.digest[:19], node, exc)
            board.peer_failed(node)
        except DownloadFailed:  # a file these bytes completed failed its hash: they came from the peer all the same
            board.done(seg, seg.pos - start, time.monotonic() - started)
            raise
        finally:
            self._count(node, seg.pos - start)
        board.put_back(seg, seg.pos - start, time.monotonic() - started)

    def _count(self, node: str, moved: int) -> None:
        if moved:
            self.download._stat("network_bytes", moved)
            self.download._stat("peer_bytes", moved)
            if self._on_peer_bytes is not None:
                self._on_peer_bytes(node, moved)

    # ---------------------------------------------------------------- bad bytes

    def recover(self, exc: DownloadFailed, view: memoryview | None = None) -> bool:
        """A file failed its hash: if peers wrote to it, re-check their ranges against a second source and
        ban those whose bytes differ (``recheck``), or, when that cannot tell, ban them all, throw its bytes
        away and fetch it again (True); a file only the hub wrote stays a failure (False). A file another
        thread is re-checking is left to it."""
        if exc.reason != INTEGRITY_MISMATCH or self.board is None:
            return False
        with self._recovering:
            elsewhere = bool(self._checking)
            bad = [f for f in self.download._files if f.bad and f not in self._checking]
            self._checking.update(bad)
        if view is None:
            view = memoryview(bytearray(self.download.settings.buffer_size))
        try:
            return all(self._recover_file(f, view) for f in bad) and bool(bad or elsewhere)
        finally:
            with self._recovering:
                self._checking.difference_update(bad)

    def _recover_file(self, f: FileProgress, view: memoryview) -> bool:
        with f.lock:
            culprits = set(f.peers) - {""}
        if not culprits:
            return False
        short, path = self.ticket.digest[:19], f.file.path
        # What the download still needs (measured before any ban, so before anything new is asked of the
        # hub for it): with the re-check's bytes (or the file's, thrown away), the most the hub can be asked
        # for until the next failure.
        log.warning(
            "%s: %s failed its hash with bytes from %s: re-checking their ranges against a second source"
            " (%d bytes left to fetch)",
            short,
            path,
            ", ".join(sorted(culprits)),
            self.download.remaining_bytes,
        )
        with self._one_recheck:
            before = self._recheck.bytes
            try:
                differ = self._recheck.run(f, view) - {""}
            except Inconclusive as why:
                self._throw_away(f, culprits, f"{why}; {self._recheck.bytes - before} bytes read again")
                return True
            finally:
                read = self._recheck.bytes - before
                self.download._stat("rechecked_bytes", read)
        log.warning(
            "%s: %s verifies with the bytes of %s replaced (%d bytes read again from a second source)",
            short,
            path,
            ", ".join(sorted(differ)),
            read,
        )
        self._ban(differ, f"its bytes of {path} differ from the file that verifies")
        return True

    def _throw_away(self, f: FileProgress, culprits: set[str], why: str) -> None:
        """The re-check of ``f`` could not tell (``why``): every peer that wrote to it is banned, its bytes
        thrown away and fetched again."""
        log.warning(
            "%s: %s could not be re-checked (%s): thrown away to be fetched again, every peer that wrote to it banned",
            self.ticket.digest[:19],
            f.file.path,
            why,
        )
        self._ban(culprits, f"{f.file.path} failed its hash with its bytes")
        f.refetch()
        self.board.refetch(f)

    def _ban(self, nodes: set[str], why: str) -> None:
        for node in self.board.ban(sorted(nodes)):
            log.warning("%s: banned peer %s for this download: %s", self.ticket.digest[:19], node, why)
            self.client.abort(node)
            self.download._stat("banned_peers")
