"""A second artifact of one repository whose files mostly are on the node already (a Ready tree with
overlapping patterns): time to Ready with those files hard-linked, against the same artifact downloaded
into an empty cache, both from the same local fake hub."""

import time

from gpustack_models.plugin.engine import READY, DownloadSettings, Engine, FetchTicket
from gpustack_models.sources.manifest import manifest_digest
from tests.plugin.conftest import manifest, random_bytes

MiB = 1024 * 1024


def ticket(hub, repo, commit, own: str) -> FetchTicket:
    files = [f for f in manifest(hub, repo, commit) if f.path.startswith("shared/") or f.path == own]
    return FetchTicket(manifest_digest(files), "huggingFace", hub.url, repo, commit, files)


def ready_in(engine: Engine, t: FetchTicket) -> float:
    started = time.perf_counter()
    engine.ensure(t)
    entry = engine.wait(t.digest, timeout=600)
    assert entry.state == READY, entry
    return time.perf_counter() - started


def test_bench_second_artifact_linked_vs_downloaded(fakehub, tmp_path, bench_scale, record):
    count, size = (48, 4 * MiB) if bench_scale == "full" else (8, 64 * 1024)
    files = {f"shared/part-{i:03d}.safetensors": random_bytes(size, seed=500 + i) for i in range(count)}
    files.update({"q4.safetensors": random_bytes(size, seed=1), "q8.safetensors": random_bytes(size, seed=2)})
    commit = fakehub.add_hf_repo("org/bench-dedupe", files)
    q4, q8 = (
        ticket(fakehub, "org/bench-dedupe", commit, "q4.safetensors"),
        ticket(fakehub, "org/bench-dedupe", commit, "q8.safetensors"),
    )
    warm = Engine(tmp_path / "warm", settings=DownloadSettings())
    cold = Engine(tmp_path / "cold", settings=DownloadSettings())
    try:
        ready_in(warm, q4)
        linked_seconds = ready_in(warm, q8)
        stats = warm.stats(q8.digest)
        cold_seconds = ready_in(cold, q8)
        stored = warm.capacity()["storedBytes"]
    finally:
        warm.close()
        cold.close()
    assert stats["linked_bytes"] == count * size and stats["network_bytes"] == size
    assert stored == (count + 2) * size
    assert linked_seconds > 0 and cold_seconds > 0
    record(
        f"second artifact of {q8.size / 1e6:.0f} MB, {count} of its {count + 1} files on the node in another tree:"
        f" Ready in {linked_seconds * 1000:.0f} ms linked ({stats['network_bytes'] / 1e6:.1f} MB fetched) vs"
        f" {cold_seconds * 1000:.0f} ms downloaded into an empty cache; both trees store {stored / 1e6:.0f} MB"
    )
