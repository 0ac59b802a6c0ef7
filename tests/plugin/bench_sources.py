"""Benchmark: the plugin's download engine from an OCI registry and from S3, each side by side with the
reference client of that protocol fetching the same content from the same server, in one run.

- OCI: a CNCF ModelPack artifact (one raw layer per file) in the suite's registry (distribution behind its
  token server). The engine fetches ``/v2/<repo>/blobs/sha256:<hex>`` (ranges for big files, after the token
  flow) on a ticket naming the manifest digest; ``oras pull --plain-http -u … --password-stdin -o <dir>
  <registry>/<repo>:<tag>`` (oras built from its Go module by ``deploy/oras/build.sh``; 3 blobs at a time, one
  connection each, each blob's digest verified) fetches the same artifact.
- A model image (modelcar): the same files under ``/models`` in one gzip layer, as buildah pushes it; the
  engine reads the layer once and writes each file from the decompressed stream, on the ticket the worker's
  resolution makes; ``oras blob fetch … -o - | tar -xz`` (a pull and an unpack, what a container runtime does
  before a modelcar's files can be read) is the yardstick.
- S3: the same files as objects in a bucket of the suite's S3 server (versitygw). The engine fetches them
  through per-file pre-signed GETs (``gpustack_models.sources.s3_links.presign``, as the API makes them);
  boto3's ``download_file`` (s3transfer: what ``aws s3 cp`` does, 8 MiB ranges over ``max_concurrency``
  threads, 10 by default) fetches each object into a directory, once with its default ``TransferConfig`` and
  once with ``max_concurrency=8`` (the engine's node-wide default of connections).

The engine is timed from ``ensure`` to the digest ``Ready`` (every byte hashed and the tree published, its
data synced to disk); the others from the start of the command or call to its return (the boto3 client is
made before the clock starts, oras's process start-up is in its time). Every tool's files are then checked
byte for byte (sha256) against the source, outside the timing. Rounds alternate the order of the tools, and
the page cache's dirty data is written back (``sync``) before each tool starts.

    python -m tests.plugin.bench_sources            # 512+256+192+64 MiB and a config file, 2 rounds
    python -m tests.plugin.bench_sources --smoke    # a few MB, seconds
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.oras import oras_binary

REPO = Path(__file__).resolve().parents[2]
MB = 1024 * 1024
FULL_FILES_MB = [512, 256, 192, 64, 0]
SMOKE_FILES_MB = [0, 1, 3]
LINK_SECONDS = 3600
TIMEOUT = 1800


def make_files(files_mb: list[int]) -> dict[str, bytes]:
    """Files of the given sizes (MiB; 0 = a small config file) with incompressible content, no two 4 MiB
    blocks alike."""
    block = os.urandom(4 * MB)
    files = {}
    for i, size_mb in enumerate(files_mb):
        if not size_mb:
            files[f"config-{i}.json"] = json.dumps({"bench": i, "pad": secrets.token_hex(240)}).encode()
            continue
        size = size_mb * MB
        chunks = [n.to_bytes(8, "little") + block[8:] for n in range(-(-size // len(block)))]
        files[f"model-{i:05d}.safetensors"] = b"".join(chunks)[:size]
    return files


def manifest_of(files: dict[str, bytes]) -> list:
    from gpustack_models.sources.manifest import ManifestFile

    return [ManifestFile(path, len(data), "sha256", hashlib.sha256(data).hexdigest()) for path, data in files.items()]


def publish_oci(registry, files: dict[str, bytes]) -> dict:
    """The files as a ModelPack artifact in a repository of its own; a user who may only pull it."""
    name = f"bench-{secrets.token_hex(4)}"
    repository = f"{name}/model"
    writer = registry.add_user(f"{name}-ci", secrets.token_hex(16), pull=f"{name}/", push=f"{name}/")
    reader = registry.add_user(f"{name}-pull", secrets.token_hex(16), pull=f"{name}/")
    commit = registry.push_modelpack(repository, "v1", files, writer)
    return {"repository": repository, "tag": "v1", "commit": commit, "user": reader}


def publish_modelcar(registry, files: dict[str, bytes]) -> dict:
    """The files under ``/models`` of an image's one gzip layer (what buildah pushes), resolved by the worker's
    code as the API would; a user who may only pull it."""
    from gpustack_models.sources import oci
    from tests.support.oci_images import push_image, tar_layer

    name = f"bench-{secrets.token_hex(4)}"
    writer = registry.add_user(f"{name}-ci", secrets.token_hex(16), pull=f"{name}/", push=f"{name}/")
    reader = registry.add_user(f"{name}-pull", secrets.token_hex(16), pull=f"{name}/")
    layer = tar_layer({f"models/{path}": data for path, data in files.items()})
    reference = push_image(registry, f"{name}/image", writer, "v1", [(layer, "gzip")])
    resolved, endpoint, repository, extents = oci.resolve(
        reference, credentials=oci.Credentials(*reader), insecure_registries=[registry.host]
    )
    blob = next(iter(extents.values()))["blob"]
    return {"resolved": resolved, "repository": repository, "extents": extents, "blob": blob, "user": reader}


def publish_s3(s3, files: dict[str, bytes]) -> dict:
    """The files as objects of a bucket of its own; each one's location (key and ETag)."""
    from gpustack_models.sources.s3_links import Location

    bucket = s3.create_bucket(f"bench-sources-{secrets.token_hex(4)}")
    locations = {path: Location(path, s3.put(bucket, path, data)["ETag"]) for path, data in files.items()}
    return {"bucket": bucket, "locations": locations}


def oci_ticket(registry, published: dict, manifest: list):
    """The ticket the API would hand a node for the artifact: the pull user's ``base64(user:password)`` (and,
    for an image, where each file is in its layers)."""
    from gpustack_models.plugin.engine import FetchTicket
    from gpustack_models.sources.manifest import manifest_digest

    user, password = published["user"]
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    commit = published["resolved"].commit if "resolved" in published else published["commit"]
    return FetchTicket(
        manifest_digest(manifest), "oci", registry.url, published["repository"], commit, manifest,
        token=token, extents=published.get("extents") or {},
    )  # fmt: skip


def s3_ticket(s3, published: dict, manifest: list):
    """The ticket the API would hand a node for the bucket: a pre-signed GET per file, no key."""
    from gpustack_models.plugin.engine import FetchTicket
    from gpustack_models.sources.manifest import manifest_digest
    from gpustack_models.sources.s3_links import Keys, presign

    keys = Keys(s3.access_key, s3.secret_key)
    bucket, locations = published["bucket"], published["locations"]
    links = {path: presign(s3.url, s3.region, keys, bucket, loc, LINK_SECONDS) for path, loc in locations.items()}
    listing = "".join(f"{loc.key} {loc.etag}\n" for loc in locations.values())
    commit = "sha256:" + hashlib.sha256(listing.encode()).hexdigest()  # any digest: the listing's here
    return FetchTicket(manifest_digest(manifest), "s3", s3.url, bucket, commit, manifest, links=links)


def verify(directory: Path, manifest: list, who: str) -> int:
    """Raise unless ``directory`` holds exactly the manifest's files, byte for byte; the number of files."""
    found = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    if found != sorted(f.path for f in manifest):
        raise RuntimeError(f"{who} left {found}, not the manifest's files")
    for f in manifest:
        digest = hashlib.sha256()
        with open(directory / f.path, "rb") as fh:
            while chunk := fh.read(4 * MB):
                digest.update(chunk)
        if digest.hexdigest() != f.hexdigest:
            raise RuntimeError(f"{who}: {f.path} differs from the source")
    return len(manifest)


def run_engine(ticket, work: Path, settings) -> tuple[float, Path]:
    """Seconds from ``ensure`` to ``Ready``, and the published tree (left in ``work``)."""
    from gpustack_models.plugin.engine import Engine

    engine = Engine(work / "engine-cache", settings=settings, concurrency=8)
    try:
        t0 = time.perf_counter()
        engine.ensure(ticket)
        entry = engine.wait(ticket.digest, timeout=TIMEOUT)
        elapsed = time.perf_counter() - t0
    finally:
        engine.close()
    if entry is None or entry.state != "Ready":
        raise RuntimeError(f"the engine's {ticket.source} download did not finish: {entry}")
    return elapsed, engine.path(ticket.digest)


def oras_env(work: Path) -> dict:
    """oras's environment: nothing of the machine's own (proxies, ORAS_* settings, its Docker credentials)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("ORAS_")}
    return env | {"DOCKER_CONFIG": str(work / "docker")}


def run_oras(oras: str, registry, published: dict, work: Path) -> tuple[float, Path]:
    """Seconds ``oras pull`` takes for the artifact, and its output directory."""
    out = work / "oras"
    user, password = published["user"]
    reference = f"{registry.host}/{published['repository']}:{published['tag']}"
    cmd = [oras, "pull", "--plain-http", "-u", user, "--password-stdin", "-o", str(out), reference]
    cmd += ["--registry-config", str(work / "oras-auth.json"), "--no-tty"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, input=password, env=oras_env(work), capture_output=True, text=True, timeout=TIMEOUT)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"oras pull failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    return elapsed, out


def run_oras_extract(oras: str, registry, published: dict, work: Path) -> tuple[float, Path]:
    """Seconds ``oras blob fetch … -o - | tar -xz`` takes for the image's layer (a pull and an unpack, as a
    container runtime does with a modelcar), and the directory of its files under ``models/``."""
    out = work / "extracted"
    out.mkdir()
    user, password = published["user"]
    reference = f"{registry.host}/{published['repository']}@{published['blob']}"
    fetch = [oras, "blob", "fetch", "--plain-http", "-u", user, "--password-stdin", "--output", "-", reference]
    fetch += ["--registry-config", str(work / "oras-auth.json")]
    script = f"set -o pipefail; {' '.join(fetch)} | tar -xzf - -C {out} --strip-components=1"
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", "-c", script], input=password, env=oras_env(work), capture_output=True, text=True,
                          timeout=TIMEOUT)  # fmt: skip
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"oras blob fetch | tar failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    return elapsed, out


def run_boto3(s3, published: dict, work: Path, concurrency: int | None) -> tuple[float, Path]:
    """Seconds boto3's ``download_file`` takes for every object, one after the other (``concurrency``: its
    ``max_concurrency``, None for the default ``TransferConfig``), and the directory."""
    from boto3.s3.transfer import TransferConfig

    out = work / "boto3"
    out.mkdir()
    config = TransferConfig() if concurrency is None else TransferConfig(max_concurrency=concurrency)
    client = s3.client()  # made before the clock starts, like the engine
    t0 = time.perf_counter()
    for path in published["locations"]:
        client.download_file(published["bucket"], path, str(out / path), Config=config)
    elapsed = time.perf_counter() - t0
    client.close()
    return elapsed, out


def rounds(runners: dict, manifest: list, work_root: Path, repeat: int) -> tuple[dict, dict]:
    """``repeat`` rounds of every runner (``name → work → (seconds, directory)``), alternating their order,
    each in a fresh directory checked byte for byte afterwards; the seconds of each, and how many files of
    each were found identical to the source."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    verified = dict.fromkeys(runners, 0)
    order = list(runners)
    for i in range(repeat):
        for name in order if i % 2 == 0 else order[::-1]:
            work = work_root / f"{name}-{i}"
            work.mkdir()
            os.sync()  # no tool pays for writing back what the publication or the one before it wrote
            try:
                seconds, directory = runners[name](work)
                verified[name] += verify(directory, manifest, name)
                times[name].append(seconds)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return times, verified


def rates(size: int, times: dict[str, list[float]], versus: str) -> dict:
    """MB/s (10^6 bytes) of each runner's best round, and ``ratio`` of each other runner: its best time over
    the engine's (above 1: the engine is faster)."""
    best = {name: min(seconds) for name, seconds in times.items()}
    out = {f"{name}_mb_s": round(size / seconds / 1e6, 1) for name, seconds in best.items()}
    out.update({f"{name}_seconds": [round(t, 3) for t in seconds] for name, seconds in times.items()})
    for name in best:
        if name != "engine":
            out[f"ratio_vs_{name}"] = round(best[name] / best["engine"], 2)
    out["ratio"] = out[f"ratio_vs_{versus}"]
    return out


def against(ticket, manifest: list, tools: dict, work_root: Path, settings, repeat: int) -> dict:
    """The engine on ``ticket`` and each of ``tools`` (``name → work → (seconds, directory)``, the first the
    yardstick of the ratio) in alternating rounds: the figures of each and the files found identical."""
    runners = {"engine": lambda work: run_engine(ticket, work, settings), **tools}
    times, verified = rounds(runners, manifest, work_root, repeat)
    return {"files": len(manifest), "verified_files": verified, **rates(ticket.size, times, next(iter(tools)))}


def bench_oci(registry, files: dict[str, bytes], work_root: Path, settings, repeat: int) -> dict:
    manifest, published, oras = manifest_of(files), publish_oci(registry, files), oras_binary()
    tools = {"oras": lambda work: run_oras(oras, registry, published, work)}
    return against(oci_ticket(registry, published, manifest), manifest, tools, work_root, settings, repeat)


def bench_modelcar(registry, files: dict[str, bytes], work_root: Path, settings, repeat: int) -> dict:
    published, oras = publish_modelcar(registry, files), oras_binary()
    manifest = list(published["resolved"].files)
    tools = {"oras_tar": lambda work: run_oras_extract(oras, registry, published, work)}
    return against(oci_ticket(registry, published, manifest), manifest, tools, work_root, settings, repeat)


def bench_s3(s3, files: dict[str, bytes], work_root: Path, settings, repeat: int) -> dict:
    manifest, published = manifest_of(files), publish_s3(s3, files)
    tools = {
        "boto3": lambda work: run_boto3(s3, published, work, None),
        "boto3_8": lambda work: run_boto3(s3, published, work, 8),
    }
    return against(s3_ticket(s3, published, manifest), manifest, tools, work_root, settings, repeat)


def run(registry, s3, files_mb: list[int] | None = None, *, repeat: int = 2, smoke: bool = False) -> dict:
    """Measure the engine against ``oras pull`` (OCI) and boto3's ``download_file`` (S3) on the same files
    from ``registry`` (``tests.support.registry.Registry``) and ``s3`` (``tests.support.s3server.S3Server``).
    ``smoke``: a few MB (ranges still used), one round, for a quick check that everything runs."""
    from gpustack_models.plugin.engine.download import DownloadSettings

    if smoke:
        files_mb, repeat = SMOKE_FILES_MB, 1
    files_mb = list(files_mb or FULL_FILES_MB)
    settings = DownloadSettings(split_threshold=2 * MB, part_size=1 * MB) if smoke else None
    work_root = Path(tempfile.mkdtemp(prefix="bench-sources-"))
    try:
        files = make_files(files_mb)
        size = sum(len(data) for data in files.values())
        result: dict = {"files_mb": files_mb, "bytes": size, "repeat": repeat}
        result["oci"] = bench_oci(registry, files, work_root, settings, repeat)
        result["modelcar"] = bench_modelcar(registry, files, work_root, settings, repeat)
        result["s3"] = bench_s3(s3, files, work_root, settings, repeat)
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    return result


def summary(result: dict) -> str:
    """The result as one line: each protocol's figures side by side."""
    size_mb, oci, s3, car = result["bytes"] / 1e6, result["oci"], result["s3"], result["modelcar"]
    return (
        f"OCI download of {size_mb:.0f} MB: plugin {oci['engine_mb_s']} MB/s vs oras pull {oci['oras_mb_s']} MB/s"
        f" (ratio {oci['ratio']}); model image of one gzip layer: plugin {car['engine_mb_s']} MB/s vs oras blob"
        f" fetch | tar -xz {car['oras_tar_mb_s']} MB/s (ratio {car['ratio']});"
        f" S3 download of {size_mb:.0f} MB: plugin {s3['engine_mb_s']} MB/s vs boto3"
        f" download_file {s3['boto3_mb_s']} MB/s (8 threads: {s3['boto3_8_mb_s']} MB/s) (ratio {s3['ratio']},"
        f" {s3['ratio_vs_boto3_8']} against 8 threads)"
    )


def main(argv=None) -> int:
    from tests.support.registry import Registry
    from tests.support.s3server import S3Server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files-mb", default=",".join(map(str, FULL_FILES_MB)), help="file sizes in MiB (0: config)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    files_mb = [int(x) for x in args.files_mb.split(",") if x.strip()]
    with Registry() as registry, S3Server() as s3:
        result = run(registry, s3, files_mb, repeat=args.repeat, smoke=args.smoke)
    print(json.dumps(result, indent=2))
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
