"""Prometheus metrics of a node's download engine.

Labels never name a tenant or content: no namespace, artifact, repository or digest, only ``state``
and ``reason`` (bounded sets). The node is identified by the scrape target, not by a label.

- ``gpustack_models_plugin_downloaded_bytes_total``: bytes received from hubs (counter);
- ``gpustack_models_plugin_linked_bytes_total``: bytes hard-linked from the node's Ready trees instead
  of downloaded (counter);
- ``gpustack_models_plugin_resumed_bytes_total``: bytes a download found on disk from an earlier attempt
  (its checkpoint, kept across restarts) and did not fetch again (counter);
- ``gpustack_models_plugin_downloads_finished_total{state}``: downloads ended ``Ready`` or ``Failed``;
- ``gpustack_models_plugin_download_failures_total{reason}``: failures by reason;
- ``gpustack_models_plugin_models{state}``: digests on the node by state, read at scrape time;
- ``gpustack_models_plugin_download_connections`` / ``..._limit``: range requests in flight, the limit;
- ``gpustack_models_plugin_capacity_bytes``, ``..._stored_bytes``, ``..._used_percent``: the volume;
  ``..._high_watermark_percent``, ``..._low_watermark_percent``: its watermarks (the store's spec), so
  ``used_percent > high_watermark_percent`` is a cache that eviction could not bring down;
- ``gpustack_models_plugin_received_bytes_total{source, peer}``: bytes received for downloads by source,
  ``source="hub"`` (``peer=""``) or ``source="peer"`` with the serving node's name;
- ``gpustack_models_plugin_peer_served_bytes_total{peer}``: bytes this node's peer endpoints served, by
  the requesting node; ``..._peer_requests_total{code}``: their answers by status code;
- ``gpustack_models_plugin_peer_uploads`` / ``..._limit``, ``..._peer_upload_rate_limit_bytes_per_second``:
  peer transfers in flight, their limit, the upload rate limit.

Node names (``peer``) are the only names in labels: bounded by the cluster's size, never a tenant's.

``Metrics(registry)`` registers on ``registry`` (a fresh ``CollectorRegistry`` by default, so
several engines in one process, as in tests, do not collide); pass ``prometheus_client.REGISTRY``
to serve them with the process's default exposition.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpustack_models.plugin.engine.failures import REASONS

PREFIX = "gpustack_models_plugin"
STATES = ("Downloading", "Ready", "Failed")


class _EngineCollector(Collector):
    def __init__(self):
        self.engine = None
        self.uploads = None  # the peer server's upload limits, when it runs

    def collect(self):
        yield from self._uploads()
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
        high, low = engine.watermarks()
        yield GaugeMetricFamily(
            f"{PREFIX}_high_watermark_percent",
            "Used percent of the volume from which Ready trees are evicted and downloads refused.",
            value=high,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_low_watermark_percent", "Used percent eviction brings the volume back down to.", value=low
        )

    def _uploads(self):
        uploads = self.uploads
        if uploads is None:
            return
        yield GaugeMetricFamily(f"{PREFIX}_peer_uploads", "Peer transfers in flight.", value=uploads.in_use)
        yield GaugeMetricFamily(
            f"{PREFIX}_peer_uploads_limit", "Node-wide limit of peer transfers in flight.", value=uploads.limit
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_peer_upload_rate_limit_bytes_per_second",
            "Node-wide peer upload rate limit (0: none).",
            value=uploads.rate.bytes_per_second,
        )


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._bytes = Counter(f"{PREFIX}_downloaded_bytes", "Bytes received from hubs.", registry=self.registry)
        self._linked = Counter(
            f"{PREFIX}_linked_bytes",
            "Bytes hard-linked from files already on the node instead of downloaded.",
            registry=self.registry,
        )
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
        self._received = Counter(
            f"{PREFIX}_received_bytes",
            "Bytes received for downloads, by source (hub, or peer with the serving node).",
            ["source", "peer"],
            registry=self.registry,
        )
        self._received.labels("hub", "")
        self._served = Counter(
            f"{PREFIX}_peer_served_bytes",
            "Bytes served to peers, by requesting node.",
            ["peer"],
            registry=self.registry,
        )
        self._peer_requests = Counter(
            f"{PREFIX}_peer_requests", "Peer endpoint answers by status code.", ["code"], registry=self.registry
        )
        self._collector = _EngineCollector()
        self.registry.register(self._collector)

    def attach(self, engine) -> None:
        """Read the engine's models and capacity at scrape time."""
        self._collector.engine = engine

    def attach_uploads(self, uploads) -> None:
        """Read the peer server's upload limits (``peer_server.UploadLimits``) at scrape time."""
        self._collector.uploads = uploads

    def bytes_downloaded(self, n: int) -> None:
        """``n`` bytes received from a hub."""
        self._bytes.inc(n)
        self._received.labels("hub", "").inc(n)

    def bytes_from_peer(self, node: str, n: int) -> None:
        """``n`` bytes received for a download from the peer endpoints of ``node``."""
        self._received.labels("peer", node).inc(n)

    def bytes_served(self, node: str, n: int) -> None:
        """``n`` bytes of this node's cache served to the plugin of ``node``."""
        self._served.labels(node).inc(n)

    def peer_answer(self, code: int) -> None:
        self._peer_requests.labels(str(code)).inc()

    def bytes_linked(self, n: int) -> None:
        self._linked.inc(n)

    def bytes_resumed(self, n: int) -> None:
        self._resumed.inc(n)

    def download_finished(self, state: str, reason: str | None) -> None:
        self._finished.labels(state).inc()
        if reason is not None:
            self._failures.labels(reason).inc()
