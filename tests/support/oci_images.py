"""Container images (modelcars) for the OCI sources' tests: tar layers built here, compressed as image builders
compress them, and pushed to the suite's registry with an OCI image manifest and config.

``tar_layer`` writes a layer: a path with bytes is a file, ``None`` a whiteout of it, ``"=>target"`` a hard
link. ``compress`` encodes one as gzip (one member, or several as ``pigz`` writes) or zstd (several frames as
zstd's multi-threaded encoder writes them). ``push_image`` pushes layers with their media types.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import zstandard

from tests.support.registry import OCI_MANIFEST

IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
MEDIA_TYPES = {"": LAYER_TAR, "gzip": f"{LAYER_TAR}+gzip", "zstd": f"{LAYER_TAR}+zstd"}


def tar_layer(files: dict[str, bytes | str | None]) -> bytes:
    """An uncompressed tar layer: each path a file (bytes), a hard link (``"=>target"``) or, ``None``, a
    whiteout of it."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in files.items():
            head, _, base = path.rpartition("/")
            if isinstance(data, str):
                info = tarfile.TarInfo(path)
                info.type, info.linkname = tarfile.LNKTYPE, data.removeprefix("=>")
                tar.addfile(info)
                continue
            info = tarfile.TarInfo(path if data is not None else f"{head}/.wh.{base}".lstrip("/"))
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data or b""))
    return out.getvalue()


def compress(layer: bytes, encoding: str, pieces: int = 1) -> bytes:
    """``layer`` encoded (``""``: as it is), in ``pieces`` gzip members or zstd frames."""
    if not encoding:
        return layer
    step = -(-len(layer) // pieces)
    chunks = [layer[i : i + step] for i in range(0, len(layer), step)]
    if encoding == "gzip":
        return b"".join(gzip.compress(chunk, compresslevel=1) for chunk in chunks)
    compressor = zstandard.ZstdCompressor(level=1)
    return b"".join(compressor.compress(chunk) for chunk in chunks)


def descriptor(digest: str, data: bytes, media_type: str) -> dict:
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def push_image(registry, repo: str, user, tag: str, layers: list[bytes | tuple[bytes, str]]) -> str:
    """A container image of ``layers`` (a tar layer, or ``(tar layer, encoding)`` to push it compressed) with an
    OCI image manifest and config; returns its reference ``host/repo:tag``."""
    pairs = [layer if isinstance(layer, tuple) else (layer, "") for layer in layers]
    diff_ids = [f"sha256:{hashlib.sha256(tar).hexdigest()}" for tar, _ in pairs]
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": diff_ids}})
    blobs = [(compress(tar, encoding, pieces=2), MEDIA_TYPES[encoding]) for tar, encoding in pairs]
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": descriptor(registry.push_blob(repo, config.encode(), user), config.encode(), IMAGE_CONFIG),
        "layers": [descriptor(registry.push_blob(repo, blob, user), blob, kind) for blob, kind in blobs],
    }
    registry.push_manifest(repo, tag, manifest, OCI_MANIFEST, user)
    return f"{registry.host}/{repo}:{tag}"
