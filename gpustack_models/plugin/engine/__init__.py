"""The node plugin's download engine: a node-local, content-addressed cache filled from the hubs.

No Django, no Kubernetes and no peers here: the plugin's glue (watching the node's NodeModelStore,
writing its status, fetching tickets from the API, serving live progress, building the fan-out to
the tickets' peers from ``plugin.peers``) drives an ``Engine``.

- ``facade``: ``Engine``, the API for the glue; it puts together the three parts below:
  - ``records``: what is known of each digest (``Item``), its record on disk, and the ``Entry`` the
    status reports;
  - ``capacity``: how long what left ``spec.models`` stays (``Retention``), the bytes the cache holds
    against the volume's watermarks and what is evicted first (``Capacity``);
  - ``jobs``: the running downloads, one per digest: started, reserved, settled, cancelled; the backoff;
- ``lifecycle``: a ``spec.models`` item as the engine needs it (``Wanted``);
- ``ticket``: ``FetchTicket``, what to download, from which sources (``HubSource``) in which order, and
  how each hub names a file's bytes;
- ``cache``: the layout on disk (published trees, partial work, per-digest records);
- ``download``: the resumable, parallel range downloader that hashes while it writes and publishes
  a verified tree with one rename; it runs the steps of the modules below:
  - ``tree``: the files of the partial tree: opened (restored or linked), closed once verified,
    checkpointed, set aside after a failure;
  - ``ranges``: one file's written ranges, hash frontier and hash;
  - ``checkpoint``: the per-file progress saved for, and restored by, the next attempt;
  - ``fetch``: HTTP range requests, retried from the last written byte, from the next source when one fails;
  - ``frontier``: hashing each file while it is written, checked against the manifest at its end;
  - ``publish``: the final verification of the tree and its publishing rename;
  - ``sharing``: files a Ready tree of the node holds, hard-linked instead of fetched, counted once;
  - ``disk``: the partial files' disk operations, whose failures (``DiskError``) are never retried;
  - ``peering``: what a download asks of the fan-out to the ticket's peers (``plugin.peers.fanout``
    is the one the glue gives);
- ``hashing``: sha256 / git blob sha1 whose running state can be checkpointed;
- ``limits``: node-wide connection slots and rate limiter;
- ``transport``: keep-alive HTTP with the ticket's proxy and CA bundle, redirects followed;
- ``metrics``: Prometheus metrics (no tenant or digest in any label);
- ``failures``: the failure reasons, the retry backoff, and the sources that failed lately.
"""

from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.download import Download, DownloadSettings, Limits
from gpustack_models.plugin.engine.facade import Engine
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
from gpustack_models.plugin.engine.metrics import Metrics
from gpustack_models.plugin.engine.peering import FanOutFactory
from gpustack_models.plugin.engine.records import DOWNLOADING, FAILED, READY, Entry
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
    "FanOutFactory",
    "FetchTicket",
    "FileHash",
    "HubSource",
    "Limits",
    "Metrics",
    "SourcePenalties",
    "backoff_seconds",
    "resumable_available",
]
