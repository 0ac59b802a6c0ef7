"""The product's image, built here without a registry: a Debian base assembled by ``debootstrap`` (the slim
Python 3.11 base the Dockerfile's ``BASE_IMAGE`` names elsewhere), and the Dockerfile built on it by
``buildah`` (chroot isolation, overlay storage in a directory of the test run's own).

The base's root filesystem is cached as a tar outside the repository, keyed by the Debian suite, its
packages and the build machine's CA bundle (copied in, so that ``pip`` inside the build trusts the same
TLS roots as the machine, a proxy's included).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

log = logging.getLogger(__name__)

SUITE = "bookworm"  # Debian 12: Python 3.11, as the Dockerfile's default base
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
BASE_IMAGE = f"localhost/gpustack-models-base:{SUITE}"
IMAGE = "localhost/gpustack-models:test"
# What the image must not carry (the Dockerfile's .dockerignore and its runtime-only requirements).
UNWANTED = ("tests", "gpustack_models/local", "deploy", ".git")


def cache_dir() -> Path:
    """Beside the Kubernetes binaries: ``$GPUSTACK_KUBE_CACHE/images``."""
    root = os.environ.get("GPUSTACK_KUBE_CACHE")
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpustack-models" / "kube"
    return Path(root) / "images"


def _key() -> str:
    digest = hashlib.sha256(f"{SUITE} {MIRROR} {' '.join(PACKAGES)}".encode())
    if HOST_CA.exists():
        digest.update(HOST_CA.read_bytes())
    return digest.hexdigest()[:16]


def base_tar() -> Path:
    """The base's root filesystem as a tar: built by debootstrap once, then reused."""
    out = cache_dir() / f"debian-{SUITE}-{_key()}.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f"rootfs-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.monotonic()
    log.warning("assembling a Debian %s base (%s) with debootstrap into %s", SUITE, ", ".join(PACKAGES), out)
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(work), MIRROR]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1200)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
        shutil.rmtree(work / junk, ignore_errors=True)
    if HOST_CA.exists():
        shutil.copyfile(HOST_CA, work / "etc/ssl/certs/ca-certificates.crt")
    with tarfile.open(f"{out}.tmp", "w") as tar:
        tar.add(work, arcname=".")
    os.replace(f"{out}.tmp", out)
    shutil.rmtree(work, ignore_errors=True)
    log.warning("Debian base ready in %.0fs (%d MB)", time.monotonic() - t0, out.stat().st_size >> 20)
    return out


class Buildah:
    """buildah with storage of its own (removed by ``clean``)."""

    def __init__(self, state: Path):
        self.state = Path(state)

    def __call__(self, *args: str, timeout: float = 1200, check: bool = True) -> subprocess.CompletedProcess:
        storage = [
            "--root",
            str(self.state / "storage"),
            "--runroot",
            str(self.state / "run"),
            "--storage-driver",
            "overlay",
        ]
        proc = subprocess.run(["buildah", *storage, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args[:3])} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        return proc

    def build(self, context: Path, tag: str, *args: str, containerfile: Path | None = None) -> None:
        extra = ["-f", str(containerfile)] if containerfile else []
        self("bud", "--isolation", "chroot", "--layers=false", *extra, *args, "-t", tag, str(context))

    def run(self, image: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        container = self("from", image).stdout.strip().splitlines()[-1]
        try:
            flags = [x for k, v in env.items() for x in ("--env", f"{k}={v}")]
            return self("run", "--isolation", "chroot", *flags, container, "--", *argv, check=False, timeout=300)
        finally:
            self("rm", container, check=False)

    def config(self, image: str) -> dict:
        return json.loads(self("inspect", "--type", "image", image).stdout)

    def clean(self) -> None:
        self("rm", "--all", check=False)
        self("rmi", "--all", "--force", check=False)
        shutil.rmtree(self.state, ignore_errors=True)


def build_image(buildah: Buildah, repo: Path, work: Path) -> None:
    """The base from its tar, then the Dockerfile on it."""
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(base_tar(), work / "base.tar")
    (work / "Containerfile").write_text('FROM scratch\nADD base.tar /\nCMD ["python3"]\n')
    buildah.build(work, BASE_IMAGE, containerfile=work / "Containerfile")
    t0 = time.monotonic()
    buildah.build(repo, IMAGE, "--build-arg", f"BASE_IMAGE={BASE_IMAGE}")
    log.warning("image %s built in %.0fs", IMAGE, time.monotonic() - t0)


@pytest.fixture(scope="session")
def product_image():
    """The image, built once per session; its buildah storage removed at the end."""
    from .paths import REPO, TEST_STATE

    tool = Buildah(TEST_STATE / "buildah")
    tool.clean()
    build_image(tool, REPO, TEST_STATE / "image-base")
    try:
        yield tool
    finally:
        tool.clean()
