"""The partial files' disk operations, whose failures are told apart from the network's.

A download opens, writes, reads back and syncs its partial files only through these functions. An
``OSError`` on the way comes out as ``DiskError``, so the code that retries network failures never
mistakes a full or failing volume for a dropped connection: a disk error ends the download at once,
with the reason ``disk_failure`` gives it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from gpustack_models.plugin.engine.failures import INSUFFICIENT_CAPACITY, SOURCE_UNAVAILABLE, DownloadFailed

_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class DiskError(Exception):
    """Opening, writing, reading back, syncing or closing a partial file failed; ``error`` is the
    ``OSError`` the system raised."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error

    @property
    def errno(self) -> int | None:
        return self.error.errno


def disk_failure(exc: DiskError | OSError) -> DownloadFailed:
    """The failure a disk error ends a download with: ``InsufficientCapacity`` when the volume (or
    the quota) is full, ``SourceUnavailable`` otherwise."""
    error = exc.error if isinstance(exc, DiskError) else exc
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return DownloadFailed(INSUFFICIENT_CAPACITY, f"the cache volume is full: {error}")
    return DownloadFailed(SOURCE_UNAVAILABLE, f"writing the cache failed: {type(error).__name__}: {error}")


def size_on_disk(path: Path) -> int:
    """The size of the file at ``path``, or -1 if there is none."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1
    except OSError as exc:
        raise DiskError(exc) from exc


def open_file(path: Path) -> int:
    """A read-write descriptor of ``path``, created (with its directories) if missing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, _OPEN_FLAGS, 0o644)
    except OSError as exc:
        raise DiskError(exc) from exc


def write_at(fd: int, chunk: memoryview, pos: int) -> None:
    """Write all of ``chunk`` at offset ``pos``."""
    try:
        while chunk:
            written = os.pwrite(fd, chunk, pos)
            chunk = chunk[written:]
            pos += written
    except OSError as exc:
        raise DiskError(exc) from exc


def read_at(fd: int, buffer: memoryview, pos: int) -> int:
    """Read into ``buffer`` from offset ``pos``; the number of bytes read (0 at the end of the file)."""
    try:
        return os.preadv(fd, [buffer], pos)
    except OSError as exc:
        raise DiskError(exc) from exc


def datasync(fd: int) -> None:
    """Make the data written through ``fd`` durable."""
    try:
        os.fdatasync(fd)
    except OSError as exc:
        raise DiskError(exc) from exc


def close_file(fd: int, *, sync: bool) -> None:
    """Close ``fd``, making its data durable first if ``sync``; closed even if the sync fails."""
    try:
        if sync:
            datasync(fd)
    finally:
        try:
            os.close(fd)
        except OSError as exc:
            raise DiskError(exc) from exc
