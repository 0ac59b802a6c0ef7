"""Benchmark: the plugin's download engine vs the ``hf download`` CLI, side by side in one run.

Both fetch the same files of the same repository from the same fake hub (in its own process, so
neither client shares an interpreter with the server), into fresh directories:

- the engine: ``Engine.ensure(ticket)`` until the digest is ``Ready`` (every byte hashed, sizes and
  the manifest digest verified, the tree published);
- ``hf download <repo> --revision <commit> --cache-dir <fresh>`` with ``HF_ENDPOINT`` at the fake
  hub (huggingface_hub's own CLI: one connection per file, 8 files at a time, no hashing);
- ``aria2c -x8 -s8 -j1`` (Debian's aria2, a download accelerator: 8 connections per file, one file at a
  time, so the same 8 connections as the engine's node-wide default; no hashing, no preallocation)
  fetching the same ``resolve`` URLs into a fresh directory.

Two scenarios: unthrottled, and with the hub sending every file body at ``per_connection_bps`` per
connection (a CDN's per-connection cap, where parallel ranges win). ``hf`` is timed as the wall time
of the command; its interpreter start-up (timed separately with ``hf version``) is also subtracted
for an adjusted figure, and the ratio uses the adjusted one, so the comparison does not flatter the
engine.

    python -m tests.plugin.bench_download            # 256+64+8 MB, throttle 16 MB/s per connection
    python -m tests.plugin.bench_download --smoke    # a few MB, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MB = 1024 * 1024
REPOSITORY = "bench/model"

_HUB_SCRIPT = r"""
import hashlib, json, sys
from tests.fakehub import FakeHub
paths = json.loads(sys.argv[1])
hub = FakeHub(lfs_threshold=1024).start()
commit = hub.add_hf_repo("bench/model", {name: path for name, path in paths.items()})
files = []
for name in paths:
    ref = hub.file_info("bench/model", name, commit)
    algorithm, hexdigest = ("sha256", ref.blob.sha256) if ref.lfs else ("gitsha1", ref.blob.gitsha1)
    files.append({"path": name, "size": ref.blob.size, "algorithm": algorithm, "hexdigest": hexdigest, "lfs": ref.lfs})
print(json.dumps({"url": hub.url, "commit": commit, "files": files}), flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
        break
    if cmd[0] == "throttle":
        hub.faults.clear()
        if int(cmd[1]) > 0:
            hub.faults.throttle(None, int(cmd[1]), times=None)
    print("ok", flush=True)
hub.stop()
"""


class _Hub:
    """The fake hub in a child process, serving files from disk."""

    def __init__(self, paths: dict[str, str]):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HUB_SCRIPT, json.dumps(paths)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        info = json.loads(self.proc.stdout.readline())
        self.url, self.commit, self.files = info["url"], info["commit"], info["files"]

    def throttle(self, bytes_per_second: int | None) -> None:
        self.proc.stdin.write(f"throttle {int(bytes_per_second or 0)}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def _make_files(directory: Path, files_mb: list[int]) -> dict[str, str]:
    """Files of the given sizes (MiB; 0 = a small config file) with incompressible content."""
    paths = {}
    block = os.urandom(4 * MB)
    for i, size_mb in enumerate(files_mb):
        name = f"model-{i:05d}.safetensors" if size_mb else f"config-{i}.json"
        path = directory / name
        size = size_mb * MB if size_mb else 512
        with open(path, "wb") as f:
            written, n = 0, 0
            while written < size:
                # a different prefix per block so no two blocks of the file are identical
                chunk = (n.to_bytes(8, "little") + block[8:])[: size - written]
                f.write(chunk)
                written += len(chunk)
                n += 1
        paths[name] = str(path)
    return paths


def _hf_env(hub: _Hub, home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_UPDATE_CHECK="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HOME=str(home),
        NO_PROXY="127.0.0.1,127.0.0.2,localhost",
        no_proxy="127.0.0.1,127.0.0.2,localhost",
    )
    return env


def _hf_cli() -> list[str]:
    exe = Path(sys.executable).with_name("hf")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "huggingface_hub.cli.hf"]


def _time_hf_startup(hub: _Hub, work: Path) -> float:
    env = _hf_env(hub, work / "hf-home-startup")
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        subprocess.run(_hf_cli() + ["version"], env=env, capture_output=True, check=False, timeout=120)
        best = min(best, time.perf_counter() - t0)
    return best


def _run_hf(hub: _Hub, work: Path, size: int) -> tuple[float, Path]:
    cache = work / "hf-cache"
    env = _hf_env(hub, work / "hf-home")
    cmd = _hf_cli() + ["download", REPOSITORY, "--revision", hub.commit, "--cache-dir", str(cache), "--quiet"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"hf download failed ({proc.returncode}): {proc.stderr[-2000:]}")
    snapshot = Path(proc.stdout.strip().splitlines()[-1])
    got = sum(p.stat().st_size for p in snapshot.rglob("*") if p.is_file())
    if got != size:
        raise RuntimeError(f"hf download fetched {got} bytes, expected {size}")
    return elapsed, snapshot


def _run_aria2(hub: _Hub, work: Path, size: int) -> float:
    """Seconds ``aria2c -x8`` takes to fetch every file (sizes checked; aria2c verifies no hash)."""
    out = work / "aria2"
    urls = "".join(f"{hub.url}/{REPOSITORY}/resolve/{hub.commit}/{f['path']}\n  out={f['path']}\n" for f in hub.files)
    (work / "aria2.txt").write_text(urls)
    cmd = ["aria2c", "-x8", "-s8", "-j1", "--min-split-size=1M", "--file-allocation=none", "--dir", str(out)]
    cmd += ["--input-file", str(work / "aria2.txt"), "--console-log-level=warn", "--summary-interval=0", "-q"]
    cmd += ["--no-conf", "--allow-overwrite=true", "--auto-file-renaming=false", "--check-certificate=false"]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"aria2c failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    got = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    if got != size:
        raise RuntimeError(f"aria2c fetched {got} bytes, expected {size}")
    return elapsed


def _run_engine(hub: _Hub, work: Path, size: int, settings=None) -> float:
    from gpustack_models.plugin.engine import Engine, FetchTicket
    from gpustack_models.sources.manifest import ManifestFile, manifest_digest

    files = [ManifestFile(f["path"], f["size"], f["algorithm"], f["hexdigest"], f["lfs"]) for f in hub.files]
    ticket = FetchTicket(manifest_digest(files), "huggingFace", hub.url, REPOSITORY, hub.commit, files)
    engine = Engine(work / "engine-cache", settings=settings, concurrency=8)
    try:
        t0 = time.perf_counter()
        engine.ensure(ticket)
        entry = engine.wait(ticket.digest, timeout=1800)
        elapsed = time.perf_counter() - t0
    finally:
        engine.close()
    if entry is None or entry.state != "Ready":
        raise RuntimeError(f"engine download did not finish: {entry}")
    tree = engine.path(ticket.digest)
    got = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())
    if got != size:
        raise RuntimeError(f"engine fetched {got} bytes, expected {size}")
    return elapsed


def run(files_mb: list[int], per_connection_bps: int | None, *, repeat: int = 2, smoke: bool = False) -> dict:
    """Measure engine vs ``hf download`` throughput (MB/s, 1 MB = 10^6 bytes) unthrottled and, if
    ``per_connection_bps`` is given, with that per-connection cap at the hub. ``smoke``: tiny files,
    one round, for a quick check that everything runs."""
    if smoke:
        files_mb, repeat = [0, 1, 3], 1
        per_connection_bps = per_connection_bps and min(per_connection_bps, 2 * MB)
    from gpustack_models.plugin.engine.download import DownloadSettings

    settings = DownloadSettings(split_threshold=2 * MB, part_size=1 * MB) if smoke else None
    work_root = Path(tempfile.mkdtemp(prefix="bench-download-"))
    result: dict = {"files_mb": list(files_mb), "per_connection_bps": per_connection_bps, "repeat": repeat}
    hub = None
    try:
        source = work_root / "source"
        source.mkdir()
        paths = _make_files(source, files_mb)
        size = sum(Path(p).stat().st_size for p in paths.values())
        result["bytes"] = size
        hub = _Hub(paths)
        startup = _time_hf_startup(hub, work_root)
        result["hf_startup_seconds"] = round(startup, 3)
        scenarios = [("unthrottled", None)]
        if per_connection_bps:
            scenarios.append(("throttled", per_connection_bps))
        for name, bps in scenarios:
            hub.throttle(bps)
            times: dict[str, list[float]] = {"engine": [], "hf": [], "aria2": []}
            runners = {
                "engine": lambda w: _run_engine(hub, w, size, settings),
                "hf": lambda w: _run_hf(hub, w, size)[0],
                "aria2": lambda w: _run_aria2(hub, w, size),
            }
            for i in range(repeat):
                for who in ("engine", "hf", "aria2") if i % 2 == 0 else ("aria2", "hf", "engine"):
                    work = work_root / f"{name}-{who}-{i}"
                    work.mkdir()
                    try:
                        times[who].append(runners[who](work))
                    finally:
                        shutil.rmtree(work, ignore_errors=True)
            engine_times, hf_times = times["engine"], times["hf"]
            engine_s, hf_s, aria2_s = min(engine_times), min(hf_times), min(times["aria2"])
            # No adjusted figure where hf's start-up (timed apart, on a machine whose load varies) takes as
            # long as its whole download: a few megabytes in the smoke run.
            hf_adjusted = hf_s - startup if hf_s > startup else None
            result[name] = {
                "engine_mb_s": round(size / engine_s / 1e6, 1),
                "hf_mb_s": round(size / hf_s / 1e6, 1),
                "hf_mb_s_without_startup": hf_adjusted and round(size / hf_adjusted / 1e6, 1),
                "ratio": hf_adjusted and round(hf_adjusted / engine_s, 2),
                "ratio_vs_hf_wall": round(hf_s / engine_s, 2),
                "aria2_mb_s": round(size / aria2_s / 1e6, 1),
                "ratio_vs_aria2": round(aria2_s / engine_s, 2),
                "aria2_seconds": [round(t, 3) for t in times["aria2"]],
                "engine_seconds": [round(t, 3) for t in engine_times],
                "hf_seconds": [round(t, 3) for t in hf_times],
            }
    finally:
        if hub is not None:
            hub.close()
        shutil.rmtree(work_root, ignore_errors=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files-mb", default="256,64,8", help="comma-separated file sizes in MiB")
    parser.add_argument("--per-connection-mbps", type=float, default=16.0, help="MB/s per connection when throttled")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    files_mb = [int(x) for x in args.files_mb.split(",") if x.strip()]
    bps = int(args.per_connection_mbps * 1e6) if args.per_connection_mbps > 0 else None
    print(json.dumps(run(files_mb, bps, repeat=args.repeat, smoke=args.smoke), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
