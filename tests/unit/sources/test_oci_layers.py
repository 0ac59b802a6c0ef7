"""Files inside tar layers: each regular file's bytes found at their offset of the blob, the blob checked against
its digest, and layers flattened as a container runtime does (replacements, whiteouts, opaque directories, hard
links; symbolic links refused under the model's path)."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile

import pytest
import zstandard

from gpustack_models.sources.hub_errors import AccessDenied, InvalidManifest
from gpustack_models.sources.oci_layers import flatten, is_compressed, is_tar, scan, selected

LAYER = "application/vnd.oci.image.layer.v1.tar"


def tar_of(*members: tuple[str, bytes | str | None]) -> bytes:
    """A tar archive: ``(name, bytes)`` a file, ``(name, None)`` a directory, ``(name, "->target")`` a symbolic
    link, ``(name, "=>target")`` a hard link."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, what in members:
            info = tarfile.TarInfo(name)
            if what is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(what, str):
                info.type = tarfile.SYMTYPE if what.startswith("->") else tarfile.LNKTYPE
                info.linkname = what[2:]
                tar.addfile(info)
            else:
                info.size = len(what)
                tar.addfile(info, io.BytesIO(what))
    return out.getvalue()


class Blobs:
    """A registry's ``get`` that answers blobs from memory (``stream=True`` as the resolver asks)."""

    def __init__(self, status: int = 200):
        self.blobs: dict[str, bytes] = {}
        self.status = status

    def layer(self, data: bytes, digest: str | None = None, media_type: str = LAYER) -> dict:
        real = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[real] = data
        return {"mediaType": media_type, "digest": digest or real, "size": len(data)}

    def get(self, path: str, accept=None, stream=False):
        assert stream and path.startswith("blobs/")
        digest = path.removeprefix("blobs/")
        data = self.blobs.get(digest) or next(iter(self.blobs.values()))
        return Response(self.status, data)


class Response:
    def __init__(self, status: int, data: bytes):
        self.status_code, self.raw = status, io.BytesIO(data)

    def close(self):
        pass


def test_each_file_is_found_at_its_offset_with_its_sha256():
    blobs = Blobs()
    data = tar_of(("models", None), ("models/config.json", b"{}"), ("models/w.bin", bytes(range(256)) * 9))
    layer = blobs.layer(data)
    members = scan(blobs, layer, "ref")
    files = {name: entry for name, kind, entry in members if kind == "file"}
    assert set(files) == {"models/config.json", "models/w.bin"}
    for entry in files.values():
        content = data[entry.offset : entry.offset + entry.size]
        assert hashlib.sha256(content).hexdigest() == entry.sha256
        assert (entry.blob, entry.blob_size) == (layer["digest"], len(data))
    assert data[files["models/w.bin"].offset : files["models/w.bin"].offset + 4] == bytes(range(4))


def test_a_layer_whose_bytes_do_not_match_its_digest_is_refused():
    blobs = Blobs()
    layer = blobs.layer(tar_of(("a.bin", b"x")), digest="sha256:" + "0" * 64)
    with pytest.raises(InvalidManifest, match="with other bytes"):
        scan(blobs, layer, "ref")


def test_a_layer_that_is_not_a_tar_archive_is_refused():
    blobs = Blobs()
    layer = blobs.layer(b"this is not a tar archive at all" * 40)
    with pytest.raises(InvalidManifest, match="not a tar archive"):
        scan(blobs, layer, "ref")


def zstd_frames(data: bytes, cut: int) -> bytes:
    """``data`` as two zstd frames, split at ``cut`` (as a multi-threaded encoder writes them)."""
    compressor = zstandard.ZstdCompressor()
    return compressor.compress(data[:cut]) + compressor.compress(data[cut:])


@pytest.mark.parametrize(
    ("media_type", "encode"),
    [
        (f"{LAYER}+gzip", gzip.compress),
        (f"{LAYER}+gzip", lambda d: gzip.compress(d[:700]) + gzip.compress(d[700:])),  # two members, as pigz writes
        (f"{LAYER}+zstd", lambda d: zstd_frames(d, 1000)),
        ("application/vnd.docker.image.rootfs.diff.tar.gzip", gzip.compress),
    ],
)
def test_a_compressed_layers_files_are_found_at_their_offset_of_the_decompressed_stream(media_type, encode):
    blobs = Blobs()
    data = tar_of(("models/config.json", b"{}"), ("models/w.bin", bytes(range(256)) * 9))
    layer = blobs.layer(encode(data), media_type=media_type)
    files = {name: entry for name, kind, entry in scan(blobs, layer, "ref") if kind == "file"}
    assert set(files) == {"models/config.json", "models/w.bin"}
    for entry in files.values():
        assert hashlib.sha256(data[entry.offset : entry.offset + entry.size]).hexdigest() == entry.sha256
        assert (entry.blob, entry.blob_size) == (layer["digest"], layer["size"])
        assert entry.encoding == media_type.rpartition("+")[2].rpartition(".")[2]


def test_a_compressed_layer_is_checked_against_its_digest_over_its_compressed_bytes():
    blobs = Blobs()
    layer = blobs.layer(gzip.compress(tar_of(("a.bin", b"x"))), digest="sha256:" + "0" * 64, media_type=f"{LAYER}+gzip")
    with pytest.raises(InvalidManifest, match="with other bytes"):
        scan(blobs, layer, "ref")


@pytest.mark.parametrize(
    ("encoding", "blob"),
    [
        ("gzip", b"not gzip at all" * 50),
        ("gzip", gzip.compress(tar_of(("a.bin", b"x" * 5000)))[:-300]),  # cut short
        ("zstd", gzip.compress(tar_of(("a.bin", b"x")))),  # another format
    ],
)
def test_a_layer_that_is_not_what_its_compression_says_is_refused(encoding, blob):
    blobs = Blobs()
    layer = blobs.layer(blob, media_type=f"{LAYER}+{encoding}")
    with pytest.raises(InvalidManifest, match=f"is not a {encoding}-compressed tar archive"):
        scan(blobs, layer, "ref")


def test_a_refused_layer_is_access_denied():
    blobs = Blobs(status=401)
    layer = blobs.layer(tar_of(("a.bin", b"x")))
    with pytest.raises(AccessDenied):
        scan(blobs, layer, "ref")


def layers_of(*tars: bytes):
    blobs = Blobs()
    return [scan(blobs, blobs.layer(t), "ref") for t in tars]


def test_later_layers_replace_and_whiteouts_delete():
    files, others = flatten(
        layers_of(
            tar_of(("models/a.bin", b"old"), ("models/b.bin", b"b"), ("models/sub/c.bin", b"c")),
            tar_of(("models/a.bin", b"new"), ("models/.wh.b.bin", b""), ("models/.wh.sub", b"")),
        )
    )
    assert sorted(files) == ["models/a.bin"] and not others
    assert files["models/a.bin"].sha256 == hashlib.sha256(b"new").hexdigest()


def test_an_opaque_directory_keeps_only_what_its_own_layer_puts_there():
    files, _ = flatten(
        layers_of(
            tar_of(("models/old.bin", b"1"), ("keep/x.bin", b"2")),
            tar_of(("models/.wh..wh..opq", b""), ("models/new.bin", b"3")),
        )
    )
    assert sorted(files) == ["keep/x.bin", "models/new.bin"]


def test_a_hard_link_is_the_file_it_links_to():
    files, others = flatten(layers_of(tar_of(("models/a.bin", b"same"), ("models/b.bin", "=>models/a.bin"))))
    assert files["models/b.bin"] == files["models/a.bin"] and not others


def test_a_symbolic_link_under_the_path_is_refused_and_elsewhere_ignored():
    files, others = flatten(layers_of(tar_of(("models/a.bin", b"a"), ("models/l", "->a.bin"), ("bin/sh", "->busybox"))))
    assert others == {"models/l", "bin/sh"}
    with pytest.raises(InvalidManifest, match="'models/l' is a link"):
        selected(files, others, "models", "ref")
    chosen = selected(files, {"bin/sh"}, "models", "ref")
    assert [f.path for f, _ in chosen.values()] == ["a.bin"]


def test_the_selection_names_files_relative_to_the_path():
    files, others = flatten(layers_of(tar_of(("./models/t/v.txt", b"v"), ("etc/x", b"x"))))
    chosen = selected(files, others, "/models/", "ref")
    assert {p: (f.path, f.size) for p, (f, _) in chosen.items()} == {"t/v.txt": ("t/v.txt", 1)}
    assert set(selected(files, others, "", "ref")) == {"models/t/v.txt", "etc/x"}


def test_a_path_leaving_the_root_is_refused():
    with pytest.raises(InvalidManifest, match="leaves its root"):
        layers_of(tar_of(("../escape.bin", b"x")))


@pytest.mark.parametrize(
    ("media_type", "tar", "compressed"),
    [
        ("application/vnd.oci.image.layer.v1.tar", True, False),
        ("application/vnd.docker.image.rootfs.diff.tar", True, False),
        ("application/vnd.cncf.model.weight.v1.tar", True, False),
        ("application/vnd.oci.image.layer.v1.tar+gzip", True, True),
        ("application/vnd.oci.image.layer.v1.tar+zstd", True, True),
        ("application/vnd.docker.image.rootfs.diff.tar.gzip", True, True),
        ("application/vnd.cncf.model.weight.v1.tar+gzip", True, True),
        ("application/vnd.example.file+gzip", False, False),
        ("application/vnd.cncf.model.weight.v1.raw", False, False),
    ],
)
def test_which_layers_are_read_as_tar_archives(media_type, tar, compressed):
    assert (is_tar(media_type), is_compressed(media_type)) == (tar, compressed)
