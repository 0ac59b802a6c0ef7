"""The node plugin's download engine: a node-local, content-addressed cache filled from the hubs.

No Django and no Kubernetes here: the plugin's glue (watching the node's NodeModelStore, writing its
status, fetching tickets from the worker, serving live progress) drives an ``Engine``.

- ``ticket``: ``FetchTicket``, what to download, from which sources (``HubSource``) in which order, and
  how each hub names a file's bytes;
- ``cache``: the layout on disk (published trees, partial work, per-digest records), capacity;
- ``download``: the resumable, parallel range downloader that hashes while it writes and publishes
  a verified tree with one rename; it runs the steps of the modules below:
  - ``ranges``: one file's written ranges, hash frontier and hash;
  - ``checkpoint``: the per-file progress saved for, and restored by, the next attempt;
  - ``fetch``: HTTP range requests, retried from the last written byte, from the next source when one fails;
  - ``frontier``: hashing each file while it is written, checked against the manifest at its end;
  - ``publish``: the final verification of the tree and its publishing rename;
  - ``sharing``: files a Ready tree of the node holds, hard-linked instead of fetched, counted once;
  - ``disk``: the partial files' disk operations, whose failures (``DiskError``) are never retried;
  - ``swarm``, ``fanout``, ``peer_client``: fetching from the ticket's peers and the hub at once (which
    segment from which source), carrying it out, and the peers' endpoints as a client;
- ``hashing``: sha256 / git blob sha1 whose running state can be checkpointed;
- ``limits``: node-wide connection slots and rate limiter;
- ``transport``: keep-alive HTTP with the ticket's proxy and CA bundle, redirects followed;
- ``engine``: ``Engine``, the API for the glue;
- ``metrics``: Prometheus metrics (no tenant or digest in any label);
- ``failures``: the failure reasons, the retry backoff, and the sources that failed lately.
"""

from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.download import Download, DownloadSettings, Limits
from gpustack_models.plugin.engine.failures import (
    ACCESS_DENIED,
    CANCELED,
    INSUFFICIENT_CAPACITY,
    INTEGRITY_MISMATCH,
    INVALID_REQUEST,
    REASONS,
    SOURCE_UNAVAILABLE,
    DownloadFailed,
    SourcePenalties,
    backoff_seconds,
)
from gpustack_models.plugin.engine.hashing import FileHash, resumable_available
from gpustack_models.plugin.engine.jobs import DOWNLOADING, FAILED, READY, Engine, Entry
from gpustack_models.plugin.engine.metrics import Metrics
from gpustack_models.plugin.engine.ticket import HUGGING_FACE, MODEL_SCOPE, FetchTicket, HubSource

__all__ = [
    "ACCESS_DENIED",
    "CANCELED",
    "DOWNLOADING",
    "FAILED",
    "HUGGING_FACE",
    "INSUFFICIENT_CAPACITY",
    "INTEGRITY_MISMATCH",
    "INVALID_REQUEST",
    "MODEL_SCOPE",
    "READY",
    "REASONS",
    "SOURCE_UNAVAILABLE",
    "Cache",
    "Download",
    "DownloadFailed",
    "DownloadSettings",
    "Engine",
    "Entry",
    "FetchTicket",
    "FileHash",
    "HubSource",
    "Limits",
    "Metrics",
    "SourcePenalties",
    "backoff_seconds",
    "resumable_available",
]
