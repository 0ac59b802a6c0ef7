"""Fixtures for the download engine's tests: the fake hub, tickets for its repositories, engines."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from gpustack_models.plugin.engine import DownloadSettings, Engine, FetchTicket
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

KiB = 1024
MiB = 1024 * 1024

# Small parts and buffers so that megabytes exercise what gigabytes do on a node.
FAST = dict(
    split_threshold=1 * MiB,
    part_size=256 * KiB,
    buffer_size=64 * KiB,
    stall_timeout=2.0,
    range_retries=3,
    http_retries=0,
    checkpoint_interval=0.2,
)


def settings(**overrides) -> DownloadSettings:
    return DownloadSettings(**{**FAST, **overrides})


def random_bytes(size: int, seed: int = 0) -> bytes:
    """Incompressible, reproducible content."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(b"%d:%d" % (seed, counter)).digest() * 64
        counter += 1
    return bytes(out[:size])


def manifest(hub, repo: str, commit: str, *, kind: str = "hf") -> list[ManifestFile]:
    """The manifest the worker would resolve for ``repo`` at ``commit``."""
    files = []
    for path in hub.files(repo, commit, kind=kind):
        ref = hub.file_info(repo, path, commit, kind=kind)
        if kind == "ms" or ref.lfs:
            files.append(ManifestFile(path, ref.blob.size, "sha256", ref.blob.sha256, ref.lfs))
        else:
            files.append(ManifestFile(path, ref.blob.size, "gitsha1", ref.blob.gitsha1, False))
    return files


def ticket_for(hub, repo: str, commit: str, *, kind: str = "hf", token: str | None = None) -> FetchTicket:
    files = manifest(hub, repo, commit, kind=kind)
    source = "huggingFace" if kind == "hf" else "modelScope"
    return FetchTicket(manifest_digest(files), source, hub.url, repo, commit, files, token=token)


def tree_files(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root).replace(os.sep, "/")] = open(path, "rb").read()
    return out


class Clock:
    """Epoch seconds that a test moves by hand."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ManualClock:
    """Monotonic seconds that move only when the rate limiter sleeps."""

    def __init__(self):
        self.now = 1000.0
        self.slept = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept += 1
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache_root(tmp_path):
    return tmp_path / "cache"


@pytest.fixture
def make_engine(cache_root):
    """``make_engine(**kwargs)``: an Engine on the test's cache root (closed after the test)."""
    engines: list[Engine] = []

    def make(**kwargs) -> Engine:
        kwargs.setdefault("settings", settings())
        engine = Engine(kwargs.pop("root", cache_root), **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close(timeout=10)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def range_start_end(header: str, size: int) -> tuple[int, int]:
    """``bytes=a-b`` as ``(a, b + 1)``."""
    spec = header.split("=", 1)[1]
    first, last = spec.split("-")
    return int(first), (int(last) + 1 if last else size)


class InFlight:
    """Counts, at the hub, the requests in flight whenever one arrives: a request is in flight from
    its arrival until the hub has handed the socket its last body byte (the client holds its
    connection slot at least that long). Timestamps would not do: a handler that has sent its last
    byte may finish a moment after the client moved on to its next request."""

    def __init__(self, hub):
        self.peak = 0
        self._hub = hub
        self._record = hub._record
        hub._record = self._arrive  # the hub logs each request as it arrives

    def _arrive(self, new) -> None:
        busy = sum(1 for r in self._hub.requests if r.method == "GET" and self._busy(r))
        self.peak = max(self.peak, busy + 1)
        self._record(new)

    @staticmethod
    def _busy(r) -> bool:
        if r.status == 0:
            return True  # no answer yet
        if r.status == 206 and r.range:
            first, last = r.range.split("=", 1)[1].split("-")
            return r.bytes_sent < int(last) - int(first) + 1
        return False  # a redirect or error answer: sent whole
