"""Files inside the tar layers of an OCI image (a modelcar) or artifact, read once by the worker.

A tar layer (``application/vnd.oci.image.layer.v1.tar``, ModelPack's ``….v1.tar``, and their ``+gzip`` and
``+zstd`` forms) is streamed once: each regular file's sha256, size and the offset of its bytes in the tar
stream are recorded, and the blob itself is checked against the layer's digest. A node then fetches a file of
an uncompressed layer by byte range at that offset of the blob; a compressed layer's files are read from one
decompressed stream of the blob (``layer_encoding``). Either way each file is verified against the recorded
sha256, as any other file.

An image's layers are applied in order, as a container runtime flattens them: a later file replaces an
earlier one, ``.wh.<name>`` deletes ``<name>`` (and what is under it), ``.wh..wh..opq`` empties its directory
of what earlier layers put there; a hard link is the file it links to. A symbolic link or a device under the
selected path is refused (``InvalidManifest``): a model directory is files.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

from gpustack_models.sources.hub_errors import AccessDenied, InvalidManifest, SourceUnavailable
from gpustack_models.sources.layer_encoding import DecodeError, DecodingReader, encoding_of
from gpustack_models.sources.manifest import InvalidPath, ManifestFile

CHUNK = 1024 * 1024


def is_tar(media_type: str) -> bool:
    """A tar layer, compressed or not."""
    return encoding_of(media_type) is not None


def is_compressed(media_type: str) -> bool:
    return bool(encoding_of(media_type))


@dataclass(frozen=True)
class Entry:
    """A regular file of a layer: its bytes are ``size`` bytes at ``offset`` of the layer's tar stream (the blob
    itself, or the blob decompressed when ``encoding`` names a compression)."""

    blob: str
    blob_size: int
    offset: int
    size: int
    sha256: str
    encoding: str = ""


class _Hashing(io.RawIOBase):
    """A reader that hashes and counts every byte read through it."""

    def __init__(self, raw):
        self.raw, self.digest, self.count = raw, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.digest.update(data)
        self.count += len(data)
        return len(data)


def _clean(name: str, said: str) -> str:
    name = posixpath.normpath(name.lstrip("/")) if name not in ("", ".", "./") else ""
    name = "" if name == "." else name
    if name == ".." or name.startswith("../"):
        raise InvalidManifest(f"{said}: a layer holds a path that leaves its root ({name!r})")
    return name


def _members(
    tar: tarfile.TarFile, layer: dict, encoding: str, said: str
) -> Iterator[tuple[str, str, Entry | str | None]]:
    """``(path, kind, what)`` of each member: ``file`` with its ``Entry``, ``hardlink`` with its target,
    ``dir``, or ``other`` (symbolic links, devices)."""
    for member in tar:
        name = _clean(member.name, said)
        if member.isreg():
            digest, stream = hashlib.sha256(), tar.extractfile(member)
            while chunk := stream.read(CHUNK):
                digest.update(chunk)
            entry = Entry(
                layer["digest"], int(layer["size"]), member.offset_data, member.size, digest.hexdigest(), encoding
            )
            yield name, "file", entry
        elif member.islnk():
            yield name, "hardlink", _clean(member.linkname, said)
        else:
            yield name, "dir" if member.isdir() else "other", None


def scan(registry, layer: dict, said: str) -> list[tuple[str, str, Entry | str | None]]:
    """Every member of the layer, read once from the registry and checked against the layer's digest."""
    response = registry.get(f"blobs/{layer['digest']}", stream=True)
    if response.status_code in (401, 403):
        raise AccessDenied(f"{said}: the registry refused a layer (HTTP {response.status_code})")
    if response.status_code != 200:
        raise SourceUnavailable(f"{said}: the registry answered HTTP {response.status_code} for a layer")
    encoding = encoding_of(str(layer.get("mediaType") or "")) or ""
    reader = _Hashing(response.raw)
    stream = DecodingReader(encoding, int(layer["size"]), lambda _: reader, retries=0) if encoding else reader
    try:
        with tarfile.open(fileobj=io.BufferedReader(stream, CHUNK), mode="r|") as tar:
            members = list(_members(tar, layer, encoding, said))
        while reader.read(CHUNK):
            pass  # the padding after the archive's end, to check the whole blob
    except (tarfile.TarError, EOFError, DecodeError) as exc:
        what = f"a {encoding}-compressed tar archive" if encoding else "a tar archive"
        raise InvalidManifest(f"{said}: layer {layer['digest']} is not {what}: {exc}") from None
    except OSError as exc:
        raise SourceUnavailable(f"{said}: reading a layer failed: {type(exc).__name__}") from None
    finally:
        response.close()
    if f"sha256:{reader.digest.hexdigest()}" != layer["digest"] or reader.count != int(layer["size"]):
        raise InvalidManifest(f"{said}: the registry served layer {layer['digest']} with other bytes")
    return members


def flatten(layers: list[list[tuple[str, str, Entry | str | None]]]) -> tuple[dict[str, Entry], set[str]]:
    """``(files, others)``: the regular files of the layers applied in order, and the other paths (links,
    devices) they leave."""
    files: dict[str, tuple[int, Entry]] = {}
    others: dict[str, int] = {}
    for index, members in enumerate(layers):
        for name, kind, what in members:
            head, _, base = name.rpartition("/")
            if base == ".wh..wh..opq":
                _remove(files, others, head, index, subtree_only=True)
            elif base.startswith(".wh."):
                _remove(files, others, posixpath.join(head, base[4:]), index + 1)
            elif kind == "file":
                files[name] = (index, what)
                others.pop(name, None)
            elif kind == "hardlink" and what in files:
                files[name] = (index, files[what][1])
            elif kind in ("other", "hardlink"):
                files.pop(name, None)
                others[name] = index
    return {name: entry for name, (_, entry) in files.items()}, set(others)


def _remove(files: dict, others: dict, path: str, before: int, subtree_only: bool = False) -> None:
    """Remove ``path`` (unless ``subtree_only``) and what is under it, as put there by layers before ``before``."""
    prefix = f"{path}/" if path else ""
    for table in (files, others):
        for name in [n for n in table if n.startswith(prefix) or (n == path and not subtree_only)]:
            owner = table[name][0] if table is files else table[name]
            if owner < before:
                del table[name]


def selected(files: dict[str, Entry], others: set[str], path: str, said: str) -> dict[str, tuple[ManifestFile, Entry]]:
    """The files under ``path`` (``""``: all), named relative to it."""
    prefix = f"{path.strip('/')}/" if path.strip("/") else ""
    links = sorted(n for n in others if n.startswith(prefix))
    if links:
        raise InvalidManifest(f"{said}: {links[0]!r} is a link or a device; a model directory holds only files")
    out = {}
    for name, entry in files.items():
        if name.startswith(prefix):
            try:
                out[name[len(prefix) :]] = (
                    ManifestFile(name[len(prefix) :], entry.size, "sha256", entry.sha256),
                    entry,
                )
            except (InvalidPath, ValueError) as exc:
                raise InvalidManifest(f"{said}: {name!r}: {exc}") from None
    return out
