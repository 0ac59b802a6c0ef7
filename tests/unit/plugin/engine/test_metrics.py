"""The engine's Prometheus metrics: what each counter and gauge reads, the series there from the start, and
labels that name no tenant or content (only states, reasons, sources, status codes and node names)."""

from __future__ import annotations

import hashlib

import pytest

from gpustack_models.plugin.engine import REASONS, Engine, Metrics
from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.peers.peer_server import UploadLimits
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

P = "gpustack_models_plugin"
WEIGHTS = b"w" * 4096
LABELS = {"state", "reason", "source", "peer", "code"}


def value(metrics: Metrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(f"{P}_{name}", labels)


@pytest.fixture
def engine(tmp_path):
    """An engine with one published tree of the repository ``org/secret-model`` and metrics attached."""
    cache = Cache(tmp_path / "cache")
    files = [ManifestFile("org-secret-model.safetensors", len(WEIGHTS), "sha256", hashlib.sha256(WEIGHTS).hexdigest())]
    digest = manifest_digest(files)
    cache.partial_tree(digest).mkdir(parents=True)
    (cache.partial_tree(digest) / files[0].path).write_bytes(WEIGHTS)
    cache.publish(digest, files)
    metrics = Metrics()
    engine = Engine(cache.root, capacity_bytes=16384, metrics=metrics, concurrency=3, bytes_per_second=5000)
    yield engine, metrics, digest
    engine.close(timeout=5)


def test_it_starts_every_bounded_series_at_zero():
    metrics = Metrics()
    for reason in REASONS:
        assert value(metrics, "download_failures_total", reason=reason) == 0
    for state in ("Ready", "Failed"):
        assert value(metrics, "downloads_finished_total", state=state) == 0
    assert value(metrics, "received_bytes_total", source="hub", peer="") == 0
    assert Metrics().registry is not metrics.registry  # engines of one process do not collide


def test_it_counts_bytes_by_source_and_downloads_by_outcome():
    metrics = Metrics()
    metrics.bytes_downloaded(100)
    metrics.bytes_from_peer("node-b", 50)
    metrics.bytes_served("node-c", 70)
    metrics.bytes_linked(30)
    metrics.bytes_resumed(20)
    metrics.peer_answer(403)
    metrics.download_finished("Failed", "SourceUnavailable")
    metrics.download_finished("Ready", None)

    assert value(metrics, "downloaded_bytes_total") == 100  # from hubs only
    assert value(metrics, "received_bytes_total", source="hub", peer="") == 100
    assert value(metrics, "received_bytes_total", source="peer", peer="node-b") == 50
    assert value(metrics, "peer_served_bytes_total", peer="node-c") == 70
    assert (value(metrics, "linked_bytes_total"), value(metrics, "resumed_bytes_total")) == (30, 20)
    assert value(metrics, "peer_requests_total", code="403") == 1
    assert value(metrics, "downloads_finished_total", state="Failed") == 1
    assert value(metrics, "downloads_finished_total", state="Ready") == 1
    assert value(metrics, "download_failures_total", reason="SourceUnavailable") == 1
    assert sum(value(metrics, "download_failures_total", reason=r) for r in REASONS) == 1


def test_it_reads_the_engines_models_limits_and_volume_at_scrape_time(engine):
    engine, metrics, _ = engine
    assert [value(metrics, "models", state=s) for s in ("Downloading", "Ready", "Failed")] == [0, 1, 0]
    assert value(metrics, "download_connections") == 0
    assert value(metrics, "download_connections_limit") == 3
    assert value(metrics, "download_rate_limit_bytes_per_second") == 5000
    assert value(metrics, "capacity_bytes") == 16384
    assert value(metrics, "stored_bytes") == len(WEIGHTS)
    assert value(metrics, "used_percent") == 25  # 4096 of 16384 bytes
    engine.set_limits(concurrency=5)
    assert value(metrics, "download_connections_limit") == 5
    assert value(metrics, "peer_uploads_limit") is None  # no peer server attached

    uploads = UploadLimits(4, 1000)
    metrics.attach_uploads(uploads)
    assert uploads.try_acquire()
    assert (value(metrics, "peer_uploads"), value(metrics, "peer_uploads_limit")) == (1, 4)
    assert value(metrics, "peer_upload_rate_limit_bytes_per_second") == 1000


def test_no_label_names_a_tenant_or_content(engine):
    engine, metrics, digest = engine
    metrics.bytes_downloaded(1)
    metrics.bytes_from_peer("node-b", 1)
    metrics.download_finished("Failed", "AccessDenied")
    metrics.peer_answer(200)
    metrics.attach_uploads(UploadLimits(1))

    samples = [sample for family in metrics.registry.collect() for sample in family.samples]

    assert {name for sample in samples for name in sample.labels} == LABELS
    texts = {text for sample in samples for text in sample.labels.values()}
    assert not [text for text in texts if digest.split(":")[1][:12] in text or "secret" in text]
    assert texts <= set(REASONS) | {"Downloading", "Ready", "Failed", "hub", "peer", "node-b", "200", ""}


def test_it_reads_the_watermarks_the_spec_set_last_beside_the_used_percent(engine):
    engine, metrics, _ = engine
    assert (value(metrics, "high_watermark_percent"), value(metrics, "low_watermark_percent")) == (80, 70)
    engine.set_watermarks(20, 10)  # 25 % used: above the new high watermark, as an alert compares them
    assert (value(metrics, "high_watermark_percent"), value(metrics, "low_watermark_percent")) == (20, 10)
    assert value(metrics, "used_percent") > value(metrics, "high_watermark_percent")
