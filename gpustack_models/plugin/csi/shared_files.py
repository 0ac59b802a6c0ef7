"""What the two containers of the plugin's Pod tell each other, in files on the node's disk.

With the plugin's ``--role mounter`` (privileged: the CSI driver, its bind mounts) and ``--role node``
(non-root, no capabilities: downloads, the cache, the HTTPS and peer servers, the store's status), the
CSI driver runs apart from the engine. They share the node's data directory, and nothing else:

- the mounter tells the node role which digests Pods mount now: ``<mounts dir>/mounted-digests`` (a
  JSON list, world-readable, in a directory only the mounter writes). The node role holds them (never
  removed, never evicted) and notes their use (``MountedFollower``).
- the node role tells the mounter what it does with each digest, for the message the kubelet shows in
  a Pod's events while its model is not Ready: ``<cache>/node-entries`` (JSON, written by the node
  role). The mounter reads it beneath the cache without following a symbolic link, a regular file of at
  most ``ENTRIES_MAX_BYTES``, every field checked; it mounts on what is on disk only: a digest is Ready
  when its published tree is a directory under ``models/`` (``SharedEngine``).

With ``--role all`` (the local stack) the driver calls the engine in the same process, and neither
file is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
import tempfile
from pathlib import Path

from gpustack_models.plugin.csi import beneath
from gpustack_models.plugin.engine.cache import MODELS, fsync_dir
from gpustack_models.plugin.engine.jobs import DOWNLOADING, FAILED, READY, Entry
from gpustack_models.plugin.engine.ticket import DIGEST_PATTERN, digest_hex

log = logging.getLogger(__name__)

MOUNTED, ENTRIES = "mounted-digests", "node-entries"
ENTRIES_MAX_BYTES = 1 << 20
_REASON = re.compile(r"[A-Za-z]{1,64}")
_MESSAGE_MAX = 256


def write_shared(path: str | os.PathLike, document) -> None:
    """Replace ``path`` with ``document`` as JSON, readable by the other container (mode 0644)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(document, separators=(",", ":"), sort_keys=True).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def read_mounted(mounts_dir: str | os.PathLike) -> set[str] | None:
    """The digests the mounter says are mounted, or ``None`` when it has not said (or not readably)."""
    try:
        with open(Path(mounts_dir) / MOUNTED, "rb") as f:
            document = json.loads(f.read(ENTRIES_MAX_BYTES))
    except (OSError, ValueError):
        return None
    if not isinstance(document, list):
        return None
    return {d for d in document if isinstance(d, str) and DIGEST_PATTERN.fullmatch(d)}


def write_entries(cache_root: str | os.PathLike, entries: list[Entry]) -> None:
    """What the node role does with each digest, for the mounter's messages."""
    rows = [
        {"digest": e.digest, "state": e.state, "sizeBytes": e.size_bytes, "downloadedBytes": e.downloaded_bytes,
         "reason": e.reason, "message": e.message, "retryTime": e.retry_time}
        for e in entries
    ]  # fmt: skip
    write_shared(Path(cache_root) / ENTRIES, rows)


def _entry(row) -> Entry | None:
    """One row of ``node-entries`` checked field by field (``None`` when anything is off)."""
    if not isinstance(row, dict) or not isinstance(row.get("digest"), str):
        return None
    sizes = [row.get("sizeBytes"), row.get("downloadedBytes")]
    if not DIGEST_PATTERN.fullmatch(row["digest"]) or row.get("state") not in (DOWNLOADING, FAILED, READY):
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 62 for n in sizes):
        return None
    reason, message, retry = row.get("reason"), row.get("message"), row.get("retryTime")
    reason = reason if isinstance(reason, str) and _REASON.fullmatch(reason) else None
    message = message[:_MESSAGE_MAX] if isinstance(message, str) and message.isprintable() else None
    retry = float(retry) if isinstance(retry, int | float) and not isinstance(retry, bool) else None
    return Entry(row["digest"], row["state"], sizes[0], sizes[1], reason, message, retry)


class PublishedTrees:
    """The cache's published trees, as the mounter reads them (the node role writes them)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def tree(self, digest: str) -> Path:
        return self.root / MODELS / digest_hex(digest)

    def published_digests(self) -> list[str]:
        try:
            names = os.listdir(self.root / MODELS)
        except OSError:
            return []
        return sorted("sha256:" + n for n in names if DIGEST_PATTERN.fullmatch("sha256:" + n))


class SharedEngine:
    """The engine as the mounter sees it, for the CSI driver: published trees on disk, the node role's
    entries for messages, and the mounted digests told back to the node role."""

    def __init__(self, cache_root: str | os.PathLike, mounts_dir: str | os.PathLike):
        self.cache = PublishedTrees(cache_root)
        self.mounts_dir = Path(mounts_dir)

    def path(self, digest: str) -> Path | None:
        """The published tree of ``digest`` when it is a directory (a symbolic link is none)."""
        tree = self.cache.tree(digest)
        try:
            return tree if stat.S_ISDIR(os.lstat(tree).st_mode) else None
        except OSError:
            return None

    def entry(self, digest: str) -> Entry | None:
        if self.path(digest) is not None:
            return Entry(digest, READY, 0, 0)
        return self._entries().get(digest)

    def _entries(self) -> dict[str, Entry]:
        try:
            root = os.open(self.cache.root, beneath.DIRECTORY | os.O_CLOEXEC)
            try:
                fd = beneath.open_beneath(root, ENTRIES, os.O_RDONLY | os.O_NONBLOCK)
            finally:
                os.close(root)
        except OSError:
            return {}
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return {}
            try:
                rows = json.loads(f.read(ENTRIES_MAX_BYTES + 1)[:ENTRIES_MAX_BYTES])
            except ValueError:
                return {}
        entries = (_entry(row) for row in rows) if isinstance(rows, list) else ()
        return {e.digest: e for e in entries if e is not None}

    def set_mounted(self, digests) -> None:
        write_shared(self.mounts_dir / MOUNTED, sorted(digests))

    def touch(self, digest: str) -> None:
        """Nothing here: the node role notes the use of a digest when it sees it mounted."""


class MountedFollower:
    """The node role's side: follows ``mounted-digests`` into the engine, and writes ``node-entries``
    from it. ``sync()`` runs on every reconcile pass; True when the mounted digests changed."""

    def __init__(self, engine, mounts_dir: str | os.PathLike):
        self.engine, self.mounts_dir = engine, Path(mounts_dir)
        self.mounted: set[str] = set()
        self.written: list | None = None

    def sync(self) -> bool:
        entries = self.engine.entries()
        if entries != self.written:
            write_entries(self.engine.cache.root, entries)
            self.written = entries
        mounted = read_mounted(self.mounts_dir)
        if mounted is None or mounted == self.mounted:
            return False
        self.engine.set_mounted(mounted)
        for digest in mounted - self.mounted:
            self.engine.touch(digest)
        self.mounted = mounted
        return True
