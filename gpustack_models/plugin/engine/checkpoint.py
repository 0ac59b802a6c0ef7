"""The checkpoint of a download: per file, what an interrupted attempt leaves for the next one.

``partial/<hex>/checkpoint.json`` holds ``{"version", "digest", "files": {path: entry}}``. An entry
is ``{"checksum", "size", "verified": true}`` for a file verified and on disk, else ``{"checksum",
"size", "written": [[start, end], ...], "hashed", "hash"}``: the byte ranges written (and made
durable before the checkpoint claimed them), the hash frontier and the hash state at it. An entry
is used only if its checksum and size are the manifest's; a written range only as far as the file
on disk reaches; a hash state only if this node can restore it (else the prefix is hashed again).
"""

from __future__ import annotations

from pathlib import Path

from gpustack_models.plugin.engine import disk
from gpustack_models.plugin.engine.cache import atomic_write_json, read_json
from gpustack_models.plugin.engine.hashing import FileHash
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.sources.manifest import ManifestFile

CHECKPOINT_VERSION = 1


def load(path: Path, digest: str) -> dict:
    """The saved entries by file path, from the checkpoint at ``path`` if it is one of ``digest``."""
    document = read_json(path)
    if (
        isinstance(document, dict)
        and document.get("version") == CHECKPOINT_VERSION
        and document.get("digest") == digest
    ):
        return document.get("files") or {}
    return {}


def save(path: Path, digest: str, files: dict) -> None:
    """Replace the checkpoint at ``path`` with ``files`` (entries by file path), atomically."""
    atomic_write_json(path, {"version": CHECKPOINT_VERSION, "digest": digest, "files": files})


def verified_entry(f: FileProgress) -> dict:
    return {"checksum": f.file.checksum, "size": f.size, "verified": True}


def progress_entry(f: FileProgress) -> dict:
    """The entry of a file still being fetched (caller holds ``f.hash_lock`` and ``f.lock``)."""
    return {
        "checksum": f.file.checksum,
        "size": f.size,
        "written": f.written_ranges(),
        "hashed": f.hashed,
        "hash": f.hasher.state() if f.hashed else None,
    }


def restore(f: FileProgress, entry) -> None:
    """Resume ``f`` from its saved ``entry`` (anything, as read from disk): verified, or its written
    ranges and hash state; a fresh hash where nothing usable was saved."""
    on_disk = disk.size_on_disk(f.path)
    if _matches(entry, f.file):
        if entry.get("verified") and on_disk == f.size:
            f.verified, f.hexdigest = True, f.file.hexdigest
            return
        _restore_ranges(f, entry.get("written") or [], on_disk)
        _restore_hash(f, entry)
    if f.hasher is None:
        f.new_hash()


def _matches(entry, mf: ManifestFile) -> bool:
    return isinstance(entry, dict) and entry.get("checksum") == mf.checksum and entry.get("size") == mf.size


def _restore_ranges(f: FileProgress, ranges, on_disk: int) -> None:
    """The saved written ranges, cut to what the file on disk holds; none if they are malformed."""
    try:
        for start, end in ranges:
            start, end = int(start), min(int(end), on_disk, f.size)
            if 0 <= start < end:
                f.add_range(start, end)
    except (TypeError, ValueError):
        f.starts, f.ends = [], []


def _restore_hash(f: FileProgress, entry: dict) -> None:
    """The saved hash state, if it covers written bytes only and this node can restore it."""
    hashed = entry.get("hashed")
    if isinstance(hashed, int) and 0 < hashed <= f.covered_end(0):
        hasher = FileHash.restore(f.file.algorithm, f.size, entry.get("hash"))
        if hasher is not None:
            f.hasher, f.hashed = hasher, hashed
