"""Files shared between the trees of one cache: what is on the node already is linked, not fetched again.

A file whose checksum (and size) a Ready tree of this node already holds, such as the files two
artifacts of one repository with overlapping patterns have in common, is hard-linked into a new
download's partial tree instead of being downloaded and stored a second time:

- every published tree keeps its verified manifest (``manifests/<hex>``: the manifest text, whose
  sha256 is the digest, so a document changed on disk is never trusted); ``SharedFiles`` indexes the
  files of those manifests by ``(checksum, size)``;
- the bytes were verified once, by the download that wrote them; a linked file is checked cheaply:
  a regular file of the manifest's size, and the link is the very inode it was made from (its
  ``(st_dev, st_ino)``, checked again before publishing); the manifest digest is recomputed over
  every file as for any download;
- a link shares the inode: a download never writes into a file that has another name (a partial file
  with ``st_nlink > 1`` that is not verified is unlinked before anything is written to it);
- removing a tree removes its names only: the other trees' links keep the bytes;
- bytes are counted once per inode (``(st_dev, st_ino)``): ``stored_bytes`` of the published trees,
  ``exclusive_bytes`` / ``freed_bytes``, what removing trees would give back to the volume.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.sources.manifest import ManifestFile, manifest_text

log = logging.getLogger(__name__)

Inode = tuple[int, int]  # (st_dev, st_ino)
Key = tuple[str, int]  # (checksum, size)


def manifest_bytes(files: Iterable[ManifestFile]) -> bytes:
    return manifest_text(files).encode("utf-8")


def parse_manifest(data: bytes, digest: str) -> list[ManifestFile] | None:
    """The files of the manifest text ``data`` if it is the one ``digest`` names, else ``None``."""
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        return None
    try:
        lines = data.decode("utf-8").split("\n")[1:-1]
        files = []
        for line in lines:
            checksum, size, path = line.split(" ", 2)
            algorithm, hexdigest = checksum.split(":", 1)
            files.append(ManifestFile(path, int(size), algorithm, hexdigest))
        return files
    except ValueError:
        return None


def regular_files(tree: Path) -> Iterator[os.stat_result]:
    """The ``lstat`` of every regular file under ``tree`` (symbolic links not followed; what cannot be read
    is skipped)."""
    stack = [os.fspath(tree)]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        yield entry.stat(follow_symlinks=False)
        except OSError:
            continue


def tree_inodes(tree: Path) -> dict[Inode, int]:
    """``(st_dev, st_ino) -> size`` of the regular files under ``tree``."""
    return {(st.st_dev, st.st_ino): st.st_size for st in regular_files(tree)}


class SharedFiles:
    """The files of the published trees: by ``(checksum, size)`` for linking, by inode for counting.

    Thread-safe. ``add`` / ``remove`` follow the trees' publishing and removal (``Cache`` calls them)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._trees: dict[str, tuple[Path, dict[Inode, int], list[Key]]] = {}
        self._holders: dict[Inode, set[str]] = {}
        self._sizes: dict[Inode, int] = {}
        self._by_key: dict[Key, dict[str, str]] = {}  # key -> {digest: path in its tree}
        self._stored = 0

    def add(self, digest: str, tree: Path, manifest: list[ManifestFile] | None) -> None:
        """Count the files of the published ``tree`` of ``digest``; with its verified ``manifest``,
        offer them for linking."""
        inodes = tree_inodes(tree)
        keys = [(f.checksum, f.size) for f in manifest or () if f.size > 0]
        with self._lock:
            self._forget(digest)
            self._trees[digest] = (tree, inodes, keys)
            for inode, size in inodes.items():
                holders = self._holders.setdefault(inode, set())
                if not holders:
                    self._sizes[inode] = size
                    self._stored += size
                holders.add(digest)
            for f in manifest or ():
                if f.size > 0:
                    self._by_key.setdefault((f.checksum, f.size), {})[digest] = f.path

    def remove(self, digest: str) -> None:
        with self._lock:
            self._forget(digest)

    def _forget(self, digest: str) -> None:
        """Caller holds the lock."""
        known = self._trees.pop(digest, None)
        if known is None:
            return
        _, inodes, keys = known
        for inode in inodes:
            holders = self._holders.get(inode)
            if holders is None:
                continue
            holders.discard(digest)
            if not holders:
                del self._holders[inode]
                self._stored -= self._sizes.pop(inode, 0)
        for key in keys:
            paths = self._by_key.get(key)
            if paths is not None:
                paths.pop(digest, None)
                if not paths:
                    del self._by_key[key]

    def find(self, f: ManifestFile) -> Path | None:
        """A published file with ``f``'s checksum and size, if a tree with a manifest holds one."""
        with self._lock:
            paths = self._by_key.get((f.checksum, f.size))
            if not paths:
                return None
            digest, path = min(paths.items())
            return self._trees[digest][0] / path

    def holds(self, inode: Inode) -> bool:
        with self._lock:
            return inode in self._holders

    def stored_bytes(self) -> int:
        """Bytes of the published trees, each inode once."""
        with self._lock:
            return self._stored

    def exclusive_bytes(self, digest: str) -> int:
        """Bytes that removing the tree of ``digest`` gives back (inodes no other tree holds)."""
        return self.freed_bytes([digest])

    def freed_bytes(self, digests: Iterable[str]) -> int:
        """Bytes that removing all these trees gives back (inodes no other tree holds)."""
        gone = set(digests)
        freed = 0
        with self._lock:
            for digest in gone:
                known = self._trees.get(digest)
                for inode, size in (known[1] if known else {}).items():
                    holders = self._holders.get(inode)
                    if holders and holders <= gone and min(holders) == digest:  # each inode once
                        freed += size
        return freed


def isolate(f: FileProgress) -> None:
    """Never write into a shared inode: a partial file of ``f`` (not verified) with another name
    (``st_nlink > 1``, such as a link an interrupted attempt made) is unlinked and its progress dropped."""
    try:
        st = os.lstat(f.path)
    except OSError:
        return
    if st.st_nlink > 1 or not stat.S_ISREG(st.st_mode):
        os.unlink(f.path)
        f.discard()


def link_existing(f: FileProgress, shared: SharedFiles) -> int:
    """Hard-link a published file with ``f``'s checksum and size into ``f``'s place and mark it
    verified; the bytes linked (0 when none is found or the link cannot be made)."""
    if f.verified:
        return 0
    isolate(f)
    if f.size == 0:
        return 0
    source = shared.find(f.file)
    if source is None:
        return 0
    try:
        inode = _link(source, f, f.size)
    except OSError as exc:
        log.debug("cannot link %s from %s: %s", f.file.path, source, exc)
        inode = None
    if inode is None:
        return 0
    f.verified, f.hexdigest, f.linked = True, f.file.hexdigest, inode
    f.mark_dirty()
    return f.size


def _link(source: Path, f: FileProgress, size: int) -> Inode | None:
    """Link ``source`` (a regular file of ``size`` bytes) in place of ``f``'s partial file (whose
    progress is dropped); the inode linked, or ``None`` (nothing left there) if that is not the file."""
    st = os.lstat(source)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return None
    target = f.path
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.unlink(target)
    except FileNotFoundError:
        pass
    f.discard()
    os.link(source, target, follow_symlinks=False)
    linked = os.lstat(target)
    if (linked.st_dev, linked.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(linked.st_mode):
        os.unlink(target)  # the source was replaced between the two calls
        return None
    return (st.st_dev, st.st_ino)


def still_linked(f: FileProgress) -> bool:
    """True if ``f`` is not a link, or is still a regular file of its size on the inode it was linked to."""
    if f.linked is None:
        return True
    try:
        st = os.lstat(f.path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == f.size and (st.st_dev, st.st_ino) == f.linked
