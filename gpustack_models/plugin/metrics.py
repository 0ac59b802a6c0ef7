"""Prometheus metrics of a node's download engine.

Labels never name a tenant or content: no namespace, artifact, repository or digest, only ``state``
and ``reason`` (bounded sets). The node is identified by the scrape target, not by a label.

- ``gpustack_models_plugin_downloaded_bytes_total``: bytes received from hubs (counter);
- ``gpustack_models_plugin_resumed_bytes_total``: bytes a download found on disk from an earlier attempt
  (its checkpoint, kept across restarts) and did not fetch again (counter);
- ``gpustack_models_plugin_downloads_finished_total{state}``: downloads ended ``Ready`` or ``Failed``;
- ``gpustack_models_plugin_download_failures_total{reason}``: failures by reason;
- ``gpustack_models_plugin_models{state}``: digests on the node by state, read at scrape time;
- ``gpustack_models_plugin_download_connections`` / ``..._limit``: range requests in flight, the limit;
- ``gpustack_models_plugin_capacity_bytes``, ``..._stored_bytes``, ``..._used_percent``: the volume.

``Metrics(registry)`` registers on ``registry`` (a fresh ``CollectorRegistry`` by default, so
several engines in one process, as in tests, do not collide); pass ``prometheus_client.REGISTRY``
to serve them with the process's default exposition.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .failures import REASONS

PREFIX = "gpustack_models_plugin"
STATES = ("Downloading", "Ready", "Failed")


class _EngineCollector(Collector):
    def __init__(self):
        self.engine = None

    def collect(self):
        engine = self.engine
        if engine is None:
            return
        models = GaugeMetricFamily(f"{PREFIX}_models", "Digests on the node by state.", labels=["state"])
        counts = dict.fromkeys(STATES, 0)
        for entry in engine.entries():
            if entry.state in counts:
                counts[entry.state] += 1
        for state, count in counts.items():
            models.add_metric([state], count)
        yield models
        yield GaugeMetricFamily(
            f"{PREFIX}_download_connections", "Range requests in flight.", value=engine.limits.slots.in_use
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_download_connections_limit",
            "Node-wide limit of range requests in flight.",
            value=engine.limits.slots.limit,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_download_rate_limit_bytes_per_second",
            "Node-wide download rate limit (0: none).",
            value=engine.limits.rate.bytes_per_second,
        )
        capacity = engine.capacity()
        yield GaugeMetricFamily(f"{PREFIX}_capacity_bytes", "Size of the cache volume.", value=capacity["totalBytes"])
        yield GaugeMetricFamily(f"{PREFIX}_stored_bytes", "Bytes held by the cache.", value=capacity["storedBytes"])
        yield GaugeMetricFamily(
            f"{PREFIX}_used_percent", "Used percent of the cache volume.", value=capacity["usedPercent"]
        )


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._bytes = Counter(f"{PREFIX}_downloaded_bytes", "Bytes received from hubs.", registry=self.registry)
        self._resumed = Counter(
            f"{PREFIX}_resumed_bytes", "Bytes found on disk from an earlier attempt.", registry=self.registry
        )
        self._finished = Counter(
            f"{PREFIX}_downloads_finished", "Downloads that ended, by final state.", ["state"], registry=self.registry
        )
        self._failures = Counter(
            f"{PREFIX}_download_failures", "Failed downloads by reason.", ["reason"], registry=self.registry
        )
        for state in ("Ready", "Failed"):
            self._finished.labels(state)
        for reason in REASONS:
            self._failures.labels(reason)
        self._collector = _EngineCollector()
        self.registry.register(self._collector)

    def attach(self, engine) -> None:
        """Read the engine's models and capacity at scrape time."""
        self._collector.engine = engine

    def bytes_downloaded(self, n: int) -> None:
        self._bytes.inc(n)

    def bytes_resumed(self, n: int) -> None:
        self._resumed.inc(n)

    def download_finished(self, state: str, reason: str | None) -> None:
        self._finished.labels(state).inc()
        if reason is not None:
            self._failures.labels(reason).inc()
