"""The product's image, built here without a registry: a Debian base assembled by ``debootstrap`` (the slim
Python 3.11 base the Dockerfile's ``BASE_IMAGE`` names elsewhere), and the Dockerfile built on it by
``buildah`` (chroot isolation, overlay storage).

The base's root filesystem is cached as a tar outside the repository, keyed by the Debian suite, its
packages and the build machine's CA bundle (copied in, so that ``pip`` inside the build trusts the same
TLS roots as the machine, a proxy's included). Beside it, buildah's storage keeps the Dockerfile's layers
from one session to the next (``--layers``: a step is reused while its instruction, its parent and the
content it copies are unchanged), so a warm build redoes only what changed: ``pip install`` only when
``requirements.txt`` does. Several checkouts share that storage (buildah locks it); each state directory
tags its image with a name of its own (``IMAGE``) and records the images its last build used.

The build's context is what a fresh clone holds: the checkout's tracked files only (``build_context``), so that
nothing untracked reaches the image (the gRPC stubs ``make protos`` generates: the Dockerfile compiles its own).

The build starts in the background as soon as the session knows one of its tests needs the image
(``pytest_collection_finish``); ``product_image`` waits for it and raises its failure. Afterwards what no
record of the last 14 days names is removed (earlier builds of a checkout, checkouts gone), only while no
session is building (a file lock), never an image a working container holds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.lanes import REPO, state_dir

log = logging.getLogger(__name__)

SUITE = "bookworm"  # Debian 12: Python 3.11, as the Dockerfile's default base
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
REPOSITORY = "localhost/gpustack-models"
# This state directory's own tag: sessions of other checkouts (or lanes) build into the same storage at once.
OWNER = hashlib.sha256(str(state_dir()).encode()).hexdigest()[:12]
IMAGE = f"{REPOSITORY}:test-{OWNER}"
# What the image must not carry (the Dockerfile's .dockerignore and its runtime-only requirements).
UNWANTED = ("tests", "gpustack_models/local", "deploy", ".git")
KEEP_SECONDS = 14 * 86400  # what no build used for this long is removed (a checkout gone, an old requirements.txt)
RUN_CONTAINER = re.compile(r"^[0-9a-f]{12}-[0-9a-f]{8}$")  # OWNER-<random>: a container of Buildah.run
BUILD_STEP = re.compile(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: (?!FROM )", re.M)  # each instruction but a stage's FROM
BUILD_ID = re.compile(r"^--> (?:Using cache )?([0-9a-f]{11,64})\s*$", re.M)  # each step's image


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


def base_image() -> str:
    """The base's name in buildah's storage, keyed like its tar."""
    return f"localhost/gpustack-models-base:{SUITE}-{_key()}"


def base_tar() -> Path:
    """The base's root filesystem as a tar: built by debootstrap once, then reused."""
    out = cache_dir() / f"debian-{SUITE}-{_key()}.tar"
    if out.exists():
        os.utime(out)  # in use: not stale
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
    """buildah on the shared storage under ``cache_dir()`` (its run state in the machine's temporary directory,
    which a reboot empties as it does the mounts recorded there)."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or cache_dir() / "buildah")
        tag = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]
        self.runroot = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"gpustack-buildah-{tag}"
        self.records = self.root / "builds"
        self.lock_file = self.root / "lock"
        self.nice = 0
        self._proc: subprocess.Popen | None = None
        self._cancelled = False

    def __call__(self, *args: str, timeout: float = 1200, check: bool = True) -> subprocess.CompletedProcess:
        storage = ["--root", str(self.root / "storage"), "--runroot", str(self.runroot), "--storage-driver", "overlay"]
        cmd = ["buildah", *storage, *args]
        if self.nice:
            cmd = ["nice", "-n", str(self.nice), *cmd]
        if self._cancelled:
            raise RuntimeError("the image's build was cancelled")
        self._proc = proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            message = f"buildah {' '.join(args[:3])} still running after {timeout:.0f}s:\n{err[-4000:]}"
            raise AssertionError(message) from None
        finally:
            self._proc = None
        done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        if check and proc.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args[:3])} failed ({proc.returncode}):\n{err[-4000:]}")
        return done

    def cancel(self) -> None:
        """Stop the command running now (buildah removes its build containers on SIGTERM) and refuse more."""
        self._cancelled = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    @contextmanager
    def locked(self, exclusive: bool, wait: bool = True):
        """A file lock beside the storage: shared by builds, exclusive for pruning. Yields whether it is held."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.lock_file, "a") as fh:
            flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
            try:
                fcntl.flock(fh, flags)
            except BlockingIOError:
                yield False
                return
            yield True

    def build(self, context: Path, tag: str, *args: str, containerfile: Path | None = None, layers=True) -> str:
        """``buildah bud``, by default keeping each step's image; returns its output (their ids on ``-->`` lines)."""
        extra = ["-f", str(containerfile)] if containerfile else []
        flags = ["--isolation", "chroot", f"--layers={str(layers).lower()}", "--force-rm"]  # a failed step's too
        return self("bud", *flags, *extra, *args, "-t", tag, str(context)).stdout

    def exists(self, image: str) -> bool:
        return self("inspect", "--type", "image", "--format", "{{.FromImageID}}", image, check=False).returncode == 0

    def image_id(self, image: str) -> str:
        return self("inspect", "--type", "image", "--format", "{{.FromImageID}}", image).stdout.strip()

    def images(self) -> list[dict]:
        """Every image, intermediate ones included, with its full id (no ``sha256:``)."""
        images = json.loads(self("images", "--all", "--json", "--no-trunc").stdout or "null") or []
        return [dict(image, id=image["id"].removeprefix("sha256:")) for image in images]

    def run(self, image: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        name = f"{OWNER}-{uuid.uuid4().hex[:8]}"  # RUN_CONTAINER: a session's, which pruning leaves
        container = self("from", "--name", name, image).stdout.strip().splitlines()[-1]
        try:
            flags = [x for k, v in env.items() for x in ("--env", f"{k}={v}")]
            return self("run", "--isolation", "chroot", *flags, container, "--", *argv, check=False, timeout=300)
        finally:
            self("rm", container, check=False)

    def config(self, image: str) -> dict:
        return json.loads(self("inspect", "--type", "image", image).stdout)

    def containers(self) -> list[str]:
        out = self("containers", "--all", "--json", check=False).stdout
        return [c["containername"] for c in json.loads(out or "null") or []]

    def remove_own_containers(self) -> None:
        """Working containers an earlier session of this state directory left (killed while running one)."""
        names = [name for name in self.containers() if name.startswith(f"{OWNER}-")]
        if names:
            self("rm", *names, check=False)


def context_dir() -> Path:
    """This state directory's copy of the checkout that the image is built from."""
    return state_dir() / "image-context"


def build_context(repo: Path, dest: Path) -> Path:
    """What a fresh clone of ``repo`` holds, in ``dest``: the tracked files only, as the working tree has them
    (edits not yet committed included, deleted files left out). Brought up to date in place (a file is copied
    again when its size or time differs; what is no longer tracked goes). buildah's layer cache compares the
    content a step copies, not where it lies nor its times, so the copy reuses the layers of the last build."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], check=True, capture_output=True).stdout
    wanted = set()
    for name in filter(None, listed.decode().split("\0")):
        source, target = repo / name, dest / name
        if not (source.is_symlink() or source.is_file()):
            continue  # deleted in the working tree, or a submodule
        wanted.add(target)
        here, there = source.lstat(), target.lstat() if target.is_symlink() or target.exists() else None
        if there is None or (here.st_size, here.st_mtime_ns, here.st_mode) != (
            there.st_size, there.st_mtime_ns, there.st_mode
        ):  # fmt: skip
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    for path in sorted(dest.rglob("*"), reverse=True):  # children before their directory
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif path not in wanted:
            path.unlink()
    return dest


def build_image(buildah: Buildah, repo: Path, work: Path) -> dict:
    """The base from its tar (once: its name is keyed like the tar), then the Dockerfile on it from a fresh-clone
    copy of ``repo`` (``context_dir()``), with the layers of earlier builds. Returns what the build used, recorded
    for pruning."""
    tar = base_tar()
    t0 = time.monotonic()
    with buildah.locked(exclusive=False):
        base = base_image()
        if not buildah.exists(base):
            work.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tar, work / "base.tar")
            (work / "Containerfile").write_text('FROM scratch\nADD base.tar /\nCMD ["python3"]\n')
            buildah.build(work, base, "--timestamp", "0", containerfile=work / "Containerfile", layers=False)
            (work / "base.tar").unlink()
        context = build_context(repo, context_dir())
        out = buildah.build(context, IMAGE, "--build-arg", f"BASE_IMAGE={base}")
        steps = BUILD_ID.findall(out)
        known = {img["id"] for img in buildah.images()}
        used = {full for short in steps for full in known if full.startswith(short)}
        used |= {buildah.image_id(base), buildah.image_id(IMAGE)}
        record = {
            "tag": IMAGE,
            "images": sorted(used),
            "cached": out.count("--> Using cache"),
            "steps": len(BUILD_STEP.findall(out)),
        }
        buildah.records.mkdir(parents=True, exist_ok=True)
        path = buildah.records / f"{OWNER}.json"
        path.with_suffix(".tmp").write_text(json.dumps(record))
        os.replace(path.with_suffix(".tmp"), path)
    record["seconds"] = round(time.monotonic() - t0, 1)
    log.warning("image %s built in %.0fs (%d of %d steps cached)", IMAGE, record["seconds"], record["cached"],
                record["steps"])  # fmt: skip
    return record


def prune(buildah: Buildah, now: float | None = None) -> list[str]:
    """Remove what no build of the last ``KEEP_SECONDS`` used: stale records, their tags and images (a build's
    record names every step's image, the cached ones too: buildah would remove an image another one was built
    on), and Debian base tars of another key. Only while no session is building (else skipped: a later session
    prunes); an image a working container uses is kept (buildah refuses to remove it). Returns what went."""
    now = time.time() if now is None else now
    removed: list[str] = []
    with buildah.locked(exclusive=True, wait=False) as held:
        if not held:
            return removed
        # No build runs now: a build's container left over (a killed build) would keep its image.
        leftovers = [name for name in buildah.containers() if not RUN_CONTAINER.match(name)]
        if leftovers:
            buildah("rm", *leftovers, check=False)
        live_tags, live_images = {base_image()}, set()
        for path in buildah.records.glob("*.json"):
            if now - path.stat().st_mtime > KEEP_SECONDS:
                path.unlink(missing_ok=True)
                continue
            record = json.loads(path.read_text())
            live_tags.add(record["tag"])
            live_images.update(record["images"])
        ours = (f"{REPOSITORY}:", "localhost/gpustack-models-base:")
        for image in sorted(buildah.images(), key=lambda i: i.get("created") or 0, reverse=True):
            names = image.get("names") or []
            if image["id"] in live_images or any(n in live_tags or not n.startswith(ours) for n in names):
                continue
            if buildah("rmi", image["id"], check=False).returncode == 0:
                removed.append(image["id"])
        current = f"debian-{SUITE}-{_key()}.tar"
        for tar in cache_dir().glob(f"debian-{SUITE}-*.tar"):
            if tar.name != current and now - tar.stat().st_mtime > KEEP_SECONDS:
                tar.unlink(missing_ok=True)
                removed.append(tar.name)
    return removed


class Background:
    """The image's build (and then the pruning) in a thread of its own, started once per session."""

    def __init__(self):
        self.buildah = Buildah()
        self.thread: threading.Thread | None = None
        self.built = threading.Event()
        self.error: BaseException | None = None
        self.record: dict = {}

    def start(self, nice: int = 0) -> None:
        if self.thread is not None:
            return
        self.buildah.nice = nice
        self.thread = threading.Thread(target=self._run, name="product-image-build", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.buildah.remove_own_containers()
            self.record = build_image(self.buildah, REPO, state_dir() / "image-base")
        except BaseException as exc:  # raised again by wait()
            self.error = exc
        finally:
            self.buildah.nice = 0  # the tests' own commands run at the usual priority
            self.built.set()
        if self.error is None:
            try:
                pruner = Buildah(self.buildah.root)
                pruner.nice = 10
                removed = prune(pruner)
                if removed:
                    log.warning("removed %d stale images and tars from the image cache", len(removed))
            except Exception:
                log.exception("pruning the image cache failed")

    def wait(self) -> Buildah:
        self.start()
        self.built.wait()
        if self.error is not None:
            raise self.error
        return self.buildah

    def finish(self) -> None:
        """At the session's end: a build still running is stopped, the pruning awaited."""
        if self.thread is None:
            return
        if not self.built.is_set():
            self.buildah.cancel()
        self.thread.join(timeout=120)


_background = Background()


def pytest_collection_finish(session):
    """Start the build once this session's tests are known (after the lanes took theirs), if one needs the image;
    at a lower CPU priority, so that it yields to the tests it runs beside."""
    if session.config.option.collectonly:
        return
    if any("product_image" in getattr(item, "fixturenames", ()) for item in session.items):
        _background.start(nice=10)


def pytest_sessionfinish(session):
    _background.finish()


@pytest.fixture(scope="session")
def product_image():
    """The image (built in the background since collection), and buildah on its storage."""
    tool = _background.wait()
    try:
        yield tool
    finally:
        tool.remove_own_containers()


def import_image(buildah, real_node) -> None:
    """The built image into the real node's containerd (its Pods never pull)."""
    from tests.support.paths import TEST_STATE

    archive = TEST_STATE / "gpustack-models-image.tar"
    archive.unlink(missing_ok=True)
    buildah("push", IMAGE, f"docker-archive:{archive}:{IMAGE}", timeout=600)
    real_node.ctr("images", "import", str(archive))
    archive.unlink()
