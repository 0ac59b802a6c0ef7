"""The last step of a download: verify the whole tree once more, then publish it with one rename.

Every file must have been verified while it was written (its hash matched the manifest's) and be
of the manifest's size on disk (a file linked from another tree: still that tree's inode); the
manifest digest recomputed from the verified files must be the ticket's. Only then are the tree's
directories made durable, its manifest kept, and the tree renamed into ``models/``: an unverified
tree is never published.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.cache import Cache, fsync_dir
from gpustack_models.plugin.engine.failures import INTEGRITY_MISMATCH, DownloadFailed
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.sharing import still_linked
from gpustack_models.sources.manifest import ManifestFile, manifest_digest


def verified_manifest(files: Iterable[FileProgress]) -> list[ManifestFile]:
    """The manifest as downloaded: each file's size on disk and the digest it hashed to. Raises
    ``DownloadFailed(IntegrityMismatch)`` for a file not verified or not of its size (marked bad)."""
    verified: list[ManifestFile] = []
    for f in files:
        if not f.verified:
            raise DownloadFailed(INTEGRITY_MISMATCH, f"{f.file.path}: not complete after the download")
        size = disk.size_on_disk(f.path)
        if size != f.size:
            f.bad = True
            raise DownloadFailed(INTEGRITY_MISMATCH, f"{f.file.path}: {size} bytes on disk, the manifest says {f.size}")
        if not still_linked(f):
            f.bad = True
            raise DownloadFailed(INTEGRITY_MISMATCH, f"{f.file.path}: not the file it was linked to any more")
        mf = f.file
        verified.append(ManifestFile(mf.path, size, mf.algorithm, f.hexdigest or "", mf.lfs))
    return verified


def verify_and_publish(cache: Cache, digest: str, files: list[FileProgress], *, durable: bool) -> Path:
    """Publish the partial tree of ``digest`` if its files are exactly what ``digest`` names;
    the published tree's path."""
    manifest = verified_manifest(files)
    actual = manifest_digest(manifest)
    if actual != digest:
        raise DownloadFailed(INTEGRITY_MISMATCH, f"the verified files hash to {actual}, not {digest}")
    if durable:
        sync_tree(cache.partial_tree(digest), files)
    return cache.publish(digest, manifest)


def sync_tree(tree: Path, files: Iterable[FileProgress]) -> None:
    """Directories' entries durable before the publishing rename (file data was synced on close)."""
    directories = {tree}
    for f in files:
        parent = f.path.parent
        while parent != tree and parent not in directories:
            directories.add(parent)
            parent = parent.parent
    for directory in directories:
        fsync_dir(directory)
