"""What is mounted where: the published volumes' records and ``/proc/self/mountinfo`` (the mounts
themselves are made through descriptors: ``beneath``).

One record per published volume (``<mounts dir>/<sha256 of volume id and target>.json``, written
before the mount): after a restart the plugin keeps the records whose target is still a mount point in
``/proc/self/mountinfo`` showing the recorded tree (same device and inode), and forgets the rest. The
plugin never unmounts on exit: Pods keep their models across its restarts.

Volumes whose release the API has not acknowledged yet are kept in ``<mounts dir>/released/``
until it does, across restarts. The mounts directory is ``<cache>/mounts`` unless
``GPUSTACK_PLUGIN_MOUNTS_DIR`` says otherwise (the split Pod: a directory only the mounter writes); records
found in ``<cache>/mounts`` then are taken over once, checked against the mounts like the others.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from gpustack_models.plugin.engine.cache import atomic_write_json, read_json

log = logging.getLogger(__name__)

MOUNTS, RELEASED = "mounts", "released"
_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(text: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


def mount_points(mountinfo: str = "/proc/self/mountinfo") -> dict[str, list[str]]:
    """Every mount point and its per-mount options (``ro``/``rw`` first), the last mount at a path last."""
    out: dict[str, list[str]] = {}
    with open(mountinfo) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6:
                out[_unescape(fields[4])] = fields[5].split(",")
    return out


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """``a`` (followed) is the directory ``b`` (not followed: a symbolic link there is never the same)."""
    try:
        sa, sb = os.stat(a), os.lstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def record_name(volume_id: str, target: str) -> str:
    return hashlib.sha256(f"{volume_id}\0{target}".encode()).hexdigest() + ".json"


@dataclass(frozen=True)
class Mounted:
    """A published volume: the Pod's volume on ``target`` shows the tree of ``digest``."""

    volume_id: str
    target: str
    digest: str
    artifact: str
    namespace: str
    pod: str
    pod_uid: str

    @classmethod
    def from_record(cls, record) -> Mounted | None:
        if not isinstance(record, dict):
            return None
        try:
            values = {k: record[k] for k in cls.__dataclass_fields__}
        except KeyError:
            return None
        return cls(**values) if all(isinstance(v, str) and v for v in values.values()) else None


class MountTable:
    """The published volumes of this node (thread-safe). ``tree(digest)``: where a digest's tree is."""

    def __init__(self, mounts_dir: str | os.PathLike, tree, legacy_dir: str | os.PathLike | None = None):
        self.dir = Path(mounts_dir)
        self.released_dir = self.dir / RELEASED
        self.released_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)  # the node role reads the mounted digests here (``shared_files``)
        self.tree = tree
        # Where the records were kept before (``<cache>/mounts``): taken over once by ``load``.
        self.legacy_dir = Path(legacy_dir) if legacy_dir is not None and Path(legacy_dir) != self.dir else None
        self._lock = threading.Lock()
        self._mounted: dict[str, Mounted] = {}  # by record name

    def shows_tree(self, target: str, digest: str, points: dict | None = None) -> bool:
        """``target`` is a mount point showing the published tree of ``digest`` (a directory, not a link)."""
        points = mount_points() if points is None else points
        real = os.path.realpath(target)
        return real in points and same_file(real, self.tree(digest))

    def load(self) -> list[Mounted]:
        """Rebuild the table from the records whose mount is still there; forget the others."""
        points = mount_points()
        kept = {}
        legacy = sorted(self.legacy_dir.glob("*.json")) if self.legacy_dir and self.legacy_dir.is_dir() else []
        for path in sorted(self.dir.glob("*.json")) + legacy:
            mounted = Mounted.from_record(read_json(path))
            named = mounted is not None and path.name == record_name(mounted.volume_id, mounted.target)
            if named and self.shows_tree(mounted.target, mounted.digest, points):
                kept[path.name] = mounted
                if path.parent != self.dir:
                    atomic_write_json(self.dir / path.name, asdict(mounted))
                    path.unlink(missing_ok=True)
                continue
            log.info("forgetting the mount record %s: its mount is gone", path.name)
            path.unlink(missing_ok=True)
        self._take_legacy_releases()
        with self._lock:
            self._mounted = kept
        return list(kept.values())

    def _take_legacy_releases(self) -> None:
        if self.legacy_dir is None or not (self.legacy_dir / RELEASED).is_dir():
            return
        for path in sorted((self.legacy_dir / RELEASED).glob("*.json")):
            record = read_json(path)
            if isinstance(record, dict) and isinstance(record.get("volumeId"), str):
                self.release_pending(record["volumeId"])
            path.unlink(missing_ok=True)

    def find(self, volume_id: str, target: str) -> Mounted | None:
        with self._lock:
            return self._mounted.get(record_name(volume_id, target))

    def at_target(self, target: str) -> Mounted | None:
        with self._lock:
            return next((m for m in self._mounted.values() if m.target == target), None)

    def digests(self) -> set[str]:
        with self._lock:
            return {m.digest for m in self._mounted.values()}

    def volume_in_use(self, volume_id: str) -> bool:
        with self._lock:
            return any(m.volume_id == volume_id for m in self._mounted.values())

    def add(self, mounted: Mounted) -> None:
        """Record ``mounted`` (before its mount is made: a record without its mount is forgotten at start)."""
        name = record_name(mounted.volume_id, mounted.target)
        atomic_write_json(self.dir / name, asdict(mounted))
        with self._lock:
            self._mounted[name] = mounted

    def forget(self, volume_id: str, target: str) -> None:
        name = record_name(volume_id, target)
        with self._lock:
            self._mounted.pop(name, None)
        (self.dir / name).unlink(missing_ok=True)

    # --- releases the API has not acknowledged yet --------------------------------------------------
    def release_pending(self, volume_id: str) -> None:
        name = hashlib.sha256(volume_id.encode()).hexdigest() + ".json"
        atomic_write_json(self.released_dir / name, {"volumeId": volume_id})

    def released(self) -> list[str]:
        out = []
        for path in sorted(self.released_dir.glob("*.json")):
            record = read_json(path)
            if isinstance(record, dict) and isinstance(record.get("volumeId"), str):
                out.append(record["volumeId"])
        return out

    def release_done(self, volume_id: str) -> None:
        name = hashlib.sha256(volume_id.encode()).hexdigest() + ".json"
        (self.released_dir / name).unlink(missing_ok=True)
