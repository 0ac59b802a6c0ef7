"""The files of one download's partial tree, each step a whole file goes through (``download`` runs them).

``PartialTree`` holds the ``FileProgress`` of every manifest file of a digest: it opens them,
restoring each from the checkpoint of an earlier attempt or hard-linking it from a Ready tree of the
node (1. in ``download``); it closes a file once hashed and matching, made durable first (4.); it
saves the checkpoint of every file's progress (5.); and after a failure it sets the files aside,
discarding those that failed verification and keeping the others for the next attempt.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpustack_models.plugin.engine import checkpoint as checkpoints
from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.disk import DiskError, disk_failure
from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.frontier import HashFrontier
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.sharing import link_existing
from gpustack_models.sources.manifest import ManifestFile


class PartialTree:
    """The files of ``digest`` in ``cache``'s partial tree, in manifest order (``files``).

    ``durable``: bytes are made durable before a checkpoint claims them and before a file counts as
    verified. ``on_failure`` hears of a disk error while closing a file (from a syncing thread).
    """

    def __init__(
        self,
        cache: Cache,
        digest: str,
        frontier: HashFrontier,
        *,
        durable: bool,
        on_failure: Callable[[DownloadFailed], None],
    ):
        self.cache = cache
        self.digest = digest
        self.durable = durable
        self.files: list[FileProgress] = []
        self._frontier = frontier
        self._on_failure = on_failure

    # ---------------------------------------------------------------- 1. open

    def open(self, manifest_files: Iterable[ManifestFile], stats: dict[str, int]) -> None:
        """Read the checkpoint and open every file, counting in ``stats`` the bytes resumed and linked."""
        tree = self.cache.partial_tree(self.digest)
        tree.mkdir(parents=True, exist_ok=True)
        saved = checkpoints.load(self.cache.checkpoint_path(self.digest), self.digest)
        for mf in manifest_files:
            self.files.append(self._open_file(mf, tree, saved.get(mf.path), stats))

    def _open_file(self, mf: ManifestFile, tree: Path, saved, stats: dict[str, int]) -> FileProgress:
        """``mf``'s progress, resumed from its ``saved`` checkpoint entry or linked from a Ready tree of
        the node; an empty file is created."""
        f = FileProgress(mf, tree / mf.path)
        checkpoints.restore(f, saved)
        linked = link_existing(f, self.cache.shared)
        if linked:
            stats["linked_bytes"] += linked
            return f
        if not f.verified and mf.size == 0:
            f.open()
            f.mark_dirty()
        stats["resumed_bytes"] += f.size if f.verified else f.written_bytes()
        stats["resumed_hash_bytes"] += f.size if f.verified else f.hashed
        return f

    # ---------------------------------------------------------------- progress (any thread)

    def on_disk_bytes(self) -> int:
        """Bytes on disk: whole verified files, the written ranges of the others."""
        return sum(f.size if f.verified else f.written_bytes() for f in self.files)

    def written(self) -> list[tuple[str, int, list[list[int]]]]:
        """Per file, its path, size and the byte ranges on disk (see ``Download.written``)."""
        out = []
        for f in self.files:
            if f.verified or f.complete:
                ranges = [[0, f.size]] if f.size else []
            else:
                with f.lock:
                    ranges = f.written_ranges()
            out.append((f.file.path, f.size, ranges))
        return out

    # ---------------------------------------------------------------- 4. close what is complete

    def close_completed(self, syncer: ThreadPoolExecutor | None) -> None:
        """Close every file hashed to its end and matching, on ``syncer``'s threads when given."""
        for f in self.files:
            if f.complete and not f.verified and not f.closing:
                f.closing = True
                if syncer is not None:
                    syncer.submit(self._close_verified, f)
                else:
                    self._close_verified(f)

    def _close_verified(self, f: FileProgress) -> None:
        try:
            f.close(sync=self.durable)
        except DiskError as exc:
            f.closing = False
            self._on_failure(disk_failure(exc))
            return
        f.verified = True
        f.mark_dirty()

    # ---------------------------------------------------------------- 5. checkpoints

    def checkpoint(self, *, sync: bool, advance: bool) -> None:
        """Make written bytes durable (``sync``), then atomically save every file's progress."""
        files, changed = {}, False
        for f in self.files:
            files[f.file.path], file_changed = self._checkpoint_entry(f, sync, advance)
            changed = changed or file_changed
        if changed:
            checkpoints.save(self.cache.checkpoint_path(self.digest), self.digest, files)

    def _checkpoint_entry(self, f: FileProgress, sync: bool, advance: bool) -> tuple[dict, bool]:
        """``f``'s checkpoint entry, its bytes made durable first (``sync``), and whether it changed."""
        if f.verified:
            return checkpoints.verified_entry(f), f.take_dirty()
        owned = not f.closing  # a complete file being closed: its syncing thread owns the descriptor
        with f.hash_lock, f.lock:
            entry = checkpoints.progress_entry(f)
            changed, fd = f.take_dirty(), f.fd
        if changed and sync and owned and fd is not None:
            try:
                disk.datasync(fd)
            except DiskError:
                pass  # closed meanwhile by the coordinator, which synced it
        if advance:
            self._frontier.advance(f)  # bytes that arrived while the hash lock was held here
        return entry, changed

    # ---------------------------------------------------------------- after a failure

    def set_aside(self, *, mismatch: bool) -> None:
        """Close every file: delete the data of those that failed verification when the download failed
        on a ``mismatch``, keep the others' for the next attempt."""
        for f in self.files:
            self._set_aside(f, discard=mismatch and f.bad)

    def _set_aside(self, f: FileProgress, *, discard: bool) -> None:
        """Close ``f``; delete its data if ``discard``, else keep it for the next attempt."""
        try:
            f.close(sync=self.durable and not discard)
        except DiskError:
            pass
        if discard:
            f.discard()
            try:
                os.unlink(f.path)
            except OSError:
                pass
        elif f.complete:
            f.verified = True
