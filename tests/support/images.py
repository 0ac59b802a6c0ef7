"""Container images for the real test node, made here without a registry.

Two images, each written as an OCI image layout tar (``oci-layout``, ``index.json`` whose manifest
carries the ``io.containerd.image.name`` annotation, and the blobs) that ``ctr images import`` loads
into containerd's ``k8s.io`` namespace, where the CRI plugin finds it; Pods use
``imagePullPolicy: Never``:

- ``pause``: the sandbox image, a static ``pause`` built from the ten lines of C below with ``gcc -static``.
- ``busybox``: Debian's static busybox (package ``busybox-static``) as ``/bin/busybox`` with a symlink
  per applet (``sh``, ``cat``, ``sha256sum``, ``sleep`` ...), for consumer Pods.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

PAUSE_IMAGE = "localhost/gpustack-test/pause:1"
BUSYBOX_IMAGE = "localhost/gpustack-test/busybox:1"
BUSYBOX = Path("/bin/busybox")

PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGINT, stop); signal(SIGTERM, stop); signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes | None = None, mode=0o755, link=None) -> None:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.uid, info.gid = mode, 0, 0, 0
    if link is not None:
        info.type, info.linkname = tarfile.SYMTYPE, link
    elif data is None:
        info.type = tarfile.DIRTYPE
    else:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def layer(files: dict[str, bytes], links: dict[str, str] = (), dirs=("tmp", "etc", "proc", "sys", "dev")) -> bytes:
    """An uncompressed layer tar: ``files`` (path -> bytes, executable), ``links`` (path -> target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        parents = sorted({str(Path(p).parent) for p in [*files, *dict(links)] if str(Path(p).parent) != "."})
        for d in sorted(set(parents) | set(dirs)):
            _tar_member(tar, d, mode=0o1777 if d == "tmp" else 0o755)
        for path, data in files.items():
            _tar_member(tar, path, data)
        for path, target in dict(links).items():
            _tar_member(tar, path, link=target, mode=0o777)
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_oci_archive(path: Path, name: str, layer_tar: bytes, entrypoint: list[str]) -> Path:
    """``name`` as an OCI image layout tar of one layer at ``path``."""
    blobs: dict[str, bytes] = {}
    diff_id = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
    layer_desc = _blob(blobs, layer_tar, "application/vnd.oci.image.layer.v1.tar")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config_desc = _blob(blobs, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "config": config_desc, "layers": [layer_desc]}
    manifest_desc = _blob(blobs, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    manifest_desc["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "1"}
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "manifests": [manifest_desc]}
    with tarfile.open(path, "w") as tar:
        _tar_member(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), mode=0o644)
        _tar_member(tar, "index.json", json.dumps(index).encode(), mode=0o644)
        for digest, data in blobs.items():
            _tar_member(tar, f"blobs/sha256/{digest.split(':')[1]}", data, mode=0o644)
    return path


def _is_static(binary: Path) -> bool:
    """An ELF executable with no PT_INTERP program header (needs no dynamic loader)."""
    data = binary.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit ELF
        return False
    phoff, phentsize, phnum = (
        int.from_bytes(data[32:40], "little"),
        int.from_bytes(data[54:56], "little"),
        int.from_bytes(data[56:58], "little"),
    )
    types = [int.from_bytes(data[phoff + i * phentsize : phoff + i * phentsize + 4], "little") for i in range(phnum)]
    return 3 not in types  # PT_INTERP


def pause_archive(directory: Path) -> Path:
    source, binary = directory / "pause.c", directory / "pause"
    source.write_text(PAUSE_C)
    subprocess.run(["gcc", "-static", "-Os", "-s", "-o", str(binary), str(source)], check=True)
    return write_oci_archive(directory / "pause.tar", PAUSE_IMAGE, layer({"pause": binary.read_bytes()}), ["/pause"])


def busybox_archive(directory: Path) -> Path:
    if not _is_static(BUSYBOX):
        raise RuntimeError(f"{BUSYBOX} is not a static executable: install Debian's busybox-static")
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    links = {f"bin/{a}": "busybox" for a in applets if a != "busybox"}
    files = {"bin/busybox": BUSYBOX.read_bytes()}
    return write_oci_archive(directory / "busybox.tar", BUSYBOX_IMAGE, layer(files, links), ["/bin/sh"])


def build_archives(directory: Path) -> dict[str, Path]:
    """Both archives in ``directory`` (made once: kept when already there)."""
    directory.mkdir(parents=True, exist_ok=True)
    archives = {"pause": directory / "pause.tar", "busybox": directory / "busybox.tar"}
    if not archives["pause"].exists():
        pause_archive(directory)
    if not archives["busybox"].exists():
        busybox_archive(directory)
    return archives


IMAGES = {"pause": PAUSE_IMAGE, "busybox": BUSYBOX_IMAGE}
