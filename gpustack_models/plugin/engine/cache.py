"""The node-local, content-addressed model cache on disk.

Layout under the cache root (``<hex>`` is the 64 hex characters of a manifest digest)::

    models/<hex>/<repository paths>      published trees: complete and verified, never modified
    partial/<hex>/tree/<repository paths> a download in progress: the files being written
    partial/<hex>/checkpoint.json        per-file progress of that download (written ranges, hash state)
    manifests/<hex>                      the verified manifest of each published tree (its text)
    state/<hex>.json                     per-digest record: failures, retry time, last use, absence
    trash/                               trees being deleted (a rename first, so a crash never
                                         leaves a half-deleted tree under models/)

Every JSON document is replaced atomically: written to a temporary file in the same directory,
fsynced, renamed over the old one, and the directory fsynced; so after ``kill -9`` (or a power
loss) a reader finds either the old or the new document, never a torn one.

A tree is published by one ``rename(partial/<hex>/tree, models/<hex>)``: a digest's directory under
``models/`` exists only once all of its files were verified. Its manifest is written just before, so
its files can be linked into later downloads (``sharing``); trees may share inodes, and the bytes
the cache holds count each inode once.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from gpustack_models.plugin.engine.sharing import SharedFiles, manifest_bytes, parse_manifest, regular_files
from gpustack_models.plugin.engine.ticket import DIGEST_PATTERN, digest_hex
from gpustack_models.sources.manifest import ManifestFile

MODELS = "models"
MANIFESTS = "manifests"
PARTIAL = "partial"
STATE = "state"
TRASH = "trash"
CHECKPOINT = "checkpoint.json"


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: str | os.PathLike, document: Any) -> None:
    """Replace ``path`` with ``document`` as JSON: temp file, fsync, rename, fsync of the directory."""
    atomic_write_bytes(path, json.dumps(document, separators=(",", ":"), sort_keys=True).encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the directory."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def read_json(path: str | os.PathLike) -> Any | None:
    """The document at ``path``, or ``None`` if it is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


def tree_bytes(path: str | os.PathLike) -> int:
    """Total size of the regular files under ``path`` (0 if it does not exist)."""
    total = 0
    stack = [os.fspath(path)]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


class Cache:
    """The directories of one cache root. Thread-safe for the operations below; callers serialise
    work on the same digest (the engine runs at most one download per digest)."""

    def __init__(self, root: str | os.PathLike, *, capacity_bytes: int | None = None):
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        for name in (MODELS, MANIFESTS, PARTIAL, STATE, TRASH):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        self.purge_trash()
        self.shared = SharedFiles()
        self._index_published()

    def _index_published(self) -> None:
        """Count the published trees' files and offer those with a manifest for linking; drop the
        manifests of trees that are not there (a crash between the manifest and the rename)."""
        published = set(self.published_digests())
        for digest in sorted(published):
            self.shared.add(digest, self.tree(digest), self.load_manifest(digest))
        for digest in self._digests(self.root / MANIFESTS):
            if digest not in published:
                self._delete_manifest(digest)

    # ---------------------------------------------------------------- paths

    def tree(self, digest: str) -> Path:
        """Where the published tree of ``digest`` is (or would be)."""
        return self.root / MODELS / digest_hex(digest)

    def partial(self, digest: str) -> Path:
        return self.root / PARTIAL / digest_hex(digest)

    def partial_tree(self, digest: str) -> Path:
        return self.partial(digest) / "tree"

    def checkpoint_path(self, digest: str) -> Path:
        return self.partial(digest) / CHECKPOINT

    def record_path(self, digest: str) -> Path:
        return self.root / STATE / f"{digest_hex(digest)}.json"

    def manifest_path(self, digest: str) -> Path:
        return self.root / MANIFESTS / digest_hex(digest)

    # ---------------------------------------------------------------- what is there

    def published(self, digest: str) -> bool:
        return self.tree(digest).is_dir()

    def published_digests(self) -> list[str]:
        return self._digests(self.root / MODELS)

    def partial_digests(self) -> list[str]:
        return self._digests(self.root / PARTIAL)

    def recorded_digests(self) -> list[str]:
        out = []
        for name in _listdir(self.root / STATE):
            if name.endswith(".json") and DIGEST_PATTERN.fullmatch("sha256:" + name[:-5]):
                out.append("sha256:" + name[:-5])
        return sorted(out)

    @staticmethod
    def _digests(directory: Path) -> list[str]:
        return sorted("sha256:" + name for name in _listdir(directory) if DIGEST_PATTERN.fullmatch("sha256:" + name))

    def tree_size(self, digest: str) -> int:
        return tree_bytes(self.tree(digest))

    def partial_bytes(self, digest: str) -> int:
        """Bytes of partial work on disk (allocated blocks, so sparse files count what they hold),
        without the files linked from published trees (counted with those)."""
        total = 0
        for st in regular_files(self.partial_tree(digest)):
            if st.st_nlink == 1 or not self.shared.holds((st.st_dev, st.st_ino)):
                total += min(st.st_size, st.st_blocks * 512)
        return total

    def stored_bytes(self) -> int:
        """Bytes the cache holds: published trees (each inode once) plus partial work (walks the disk)."""
        total = self.shared.stored_bytes()
        return total + sum(self.partial_bytes(d) for d in self.partial_digests())

    # ---------------------------------------------------------------- records

    def load_record(self, digest: str) -> dict | None:
        record = read_json(self.record_path(digest))
        return record if isinstance(record, dict) else None

    def save_record(self, digest: str, record: dict) -> None:
        atomic_write_json(self.record_path(digest), record)

    def delete_record(self, digest: str) -> None:
        try:
            os.unlink(self.record_path(digest))
            fsync_dir(self.root / STATE)
        except FileNotFoundError:
            pass

    # ---------------------------------------------------------------- manifests of published trees

    def load_manifest(self, digest: str) -> list[ManifestFile] | None:
        """The verified manifest of the published tree of ``digest``; ``None`` if there is none or it
        is not the one ``digest`` names."""
        try:
            data = self.manifest_path(digest).read_bytes()
        except OSError:
            return None
        return parse_manifest(data, digest)

    def _delete_manifest(self, digest: str) -> None:
        try:
            os.unlink(self.manifest_path(digest))
        except FileNotFoundError:
            pass

    # ---------------------------------------------------------------- volume

    def volume(self, stored_bytes: int | None = None) -> tuple[int, int]:
        """``(total bytes, used bytes)`` of the volume holding the cache, from ``statvfs``.

        With ``capacity_bytes`` set (a volume of that size, e.g. in tests or a quota), the total is
        that and the used bytes are the cache's own: ``stored_bytes`` if the caller knows them,
        else counted on disk."""
        if self.capacity_bytes is not None:
            used = stored_bytes if stored_bytes is not None else self.stored_bytes()
            return int(self.capacity_bytes), int(used)
        st = os.statvfs(self.root)
        total = st.f_blocks * st.f_frsize
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        return total, used

    # ---------------------------------------------------------------- changes

    def publish(self, digest: str, manifest: list[ManifestFile] | None = None) -> Path:
        """Move the finished partial tree to ``models/<hex>`` in one rename; drop the rest of the
        partial work. ``manifest``: its verified files, kept so later downloads can link them.
        Raises ``FileExistsError`` if the digest is already published."""
        target = self.tree(digest)
        source = self.partial_tree(digest)
        with self._lock:
            if target.exists():
                raise FileExistsError(f"{digest} is already published")
            if manifest is not None:
                atomic_write_bytes(self.manifest_path(digest), manifest_bytes(manifest))
            os.rename(source, target)
            fsync_dir(target.parent)
        self.shared.add(digest, target, manifest)
        self._discard(self.partial(digest))
        return target

    def remove(self, digest: str) -> bool:
        """Delete the published tree and the partial work of ``digest`` (not its record); True if
        anything was there. Files other trees linked stay theirs."""
        self.shared.remove(digest)  # offered for linking no more, before it goes
        found = False
        for path in (self.tree(digest), self.partial(digest)):
            if path.exists():
                found = True
                self._discard(path)
        self._delete_manifest(digest)
        return found

    def remove_partial(self, digest: str) -> None:
        self._discard(self.partial(digest))

    def _discard(self, path: Path) -> None:
        """Rename into trash/ (atomic: the tree vanishes from where it was at once), then delete."""
        trash = self.root / TRASH / f"{path.name}.{uuid.uuid4().hex[:12]}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV,):
                raise
            trash = path
        fsync_dir(path.parent)
        shutil.rmtree(trash, ignore_errors=True)

    def purge_trash(self) -> None:
        for name in _listdir(self.root / TRASH):
            shutil.rmtree(self.root / TRASH / name, ignore_errors=True)
        for directory in (STATE, MANIFESTS):
            for name in _listdir(self.root / directory):
                if name.startswith("."):  # a temporary document of an interrupted write
                    try:
                        os.unlink(self.root / directory / name)
                    except OSError:
                        pass


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
