"""NodeModelStore: the model cache of one node, named after it; names no tenant."""

from __future__ import annotations

from gpustack_models.kinds.base import Column, Field, ResourceKind, age_column, store_models
from gpustack_models.kinds.formatting import human_bytes, volume_used
from gpustack_models.kinds.schema import Rule, array, boolean, conditions, digest, integer, obj, string, timestamp

# The states of a digest on a node, and where its bytes came from (shared by the plugin's engine, the
# mirror and the console).
DOWNLOADING, READY, FAILED = "Downloading", "Ready", "Failed"
MODEL_STATES = (DOWNLOADING, READY, FAILED)
SOURCE_HUB, SOURCE_PEER = "Hub", "Peer"
# Why a digest failed on a node: the fixed set a status entry's ``reason`` is one of (kube-apiserver refuses
# any other, 422). The download engine fails for the first six; ``Unknown`` is what the plugin reports for a
# failure it cannot name (e.g. a record on disk written by another version). A node's reason reaches
# tenants only as one of these, counted; its free-text ``message`` never does.
UNKNOWN_REASON = "Unknown"
FAILURE_REASONS = (
    "InvalidRequest",
    "AccessDenied",
    "SourceUnavailable",
    "IntegrityMismatch",
    "InsufficientCapacity",
    "Canceled",
    UNKNOWN_REASON,
)


def failure_reason(value) -> str:
    """``value`` when it is one of the fixed failure reasons, else ``Unknown``."""
    return value if value in FAILURE_REASONS else UNKNOWN_REASON


# The bounds of the node's limits in spec (the service keeps the Node's annotations within them).
MAX_DOWNLOAD_CONCURRENCY, MAX_UPLOAD_CONNECTIONS, MAX_BYTES_PER_SECOND = 256, 1024, 2**63 - 1

_NODE_MODEL_STORE_SPEC = obj(
    "What the node is asked to hold, and how. Written by the service only.",
    watermarks=obj(
        "Disk use thresholds of the cache: no download starts past high; collection frees down to low.",
        rules=(Rule("self.lowPercent <= self.highPercent", "lowPercent must not exceed highPercent"),),
        default={"highPercent": 80, "lowPercent": 70},
        highPercent=integer(
            "Percent of the cache's volume that downloads may fill.", default=80, minimum=1, maximum=100
        ),
        lowPercent=integer("Percent collection frees down to.", default=70, minimum=0, maximum=100),
    ),
    download=obj(
        "Download limits across every download of the node.",
        default={"concurrency": 8, "bytesPerSecond": 0},
        concurrency=integer(
            "Parallel connections across all downloads.", default=8, minimum=1, maximum=MAX_DOWNLOAD_CONCURRENCY
        ),
        bytesPerSecond=integer(
            "Total bandwidth cap in bytes per second; 0 for none.", int64=True, default=0, minimum=0
        ),
    ),
    upload=obj(
        "Upload limits of the node's peer endpoints, across every transfer to other nodes; a field left out "
        "keeps the node plugin's own setting.",
        connections=integer(
            "Transfers to peers at once; one more is told to retry later (503).",
            minimum=1,
            maximum=MAX_UPLOAD_CONNECTIONS,
        ),
        bytesPerSecond=integer("Total upload bandwidth cap in bytes per second; 0 for none.", int64=True, minimum=0),
    ),
    hub=obj(
        "How the node reaches the hubs.",
        huggingFaceEndpoint=string("Hugging Face endpoint or mirror.", max_length=2048),
        modelScopeEndpoint=string("ModelScope endpoint or mirror.", max_length=2048),
        proxy=string("HTTPS proxy URL.", max_length=2048),
        caBundle=string("PEM CA bundle trusted for the hubs and the proxy.", max_length=262144),
    ),
    models=array(
        obj(
            "Content the node is asked to hold.",
            required=("digest",),
            digest=digest("The manifest digest."),
            pinned=boolean("Kept regardless of disk pressure.", default=False),
            collectTime=timestamp(
                "Set while nothing references the digest on this node: when it leaves spec.models. The node "
                "may evict it earlier under disk pressure and does not download it meanwhile."
            ),
        ),
        "Digests the node is asked to hold, computed from every reference to the node.",
        max_items=256,
        list_type="map",
        list_map_keys=("digest",),
    ),
)

_NODE_MODEL_STORE_STATUS = obj(
    "What the node holds, written by the node's plugin only.",
    observedGeneration=integer("The generation last processed.", int64=True, minimum=0),
    capacity=obj(
        "The cache volume.",
        totalBytes=integer("Size of the cache's volume.", int64=True, minimum=0),
        storedBytes=integer("Bytes held by the cache, published and partial.", int64=True, minimum=0),
        usedPercent=integer("Percent of the volume in use.", minimum=0, maximum=100),
    ),
    models=array(
        obj(
            "One digest on this node.",
            required=("digest", "state"),
            digest=digest("The manifest digest."),
            state=string("Downloading, Ready or Failed.", enum=MODEL_STATES),
            sizeBytes=integer("Total size of the content.", int64=True, minimum=0),
            downloadedBytes=integer("Bytes downloaded and verified so far.", int64=True, minimum=0),
            reason=string("Why it failed: " + ", ".join(FAILURE_REASONS) + ".", enum=FAILURE_REASONS),
            message=string("Details of the failure, for administrators only.", max_length=4096),
            retryTime=timestamp("Earliest next attempt after a failure."),
            lastUsedTime=timestamp("When the content was last used."),
            source=string("Where the bytes came from.", enum=(SOURCE_HUB, SOURCE_PEER)),
            pinned=boolean("Kept regardless of disk pressure (from spec.models)."),
            collectTime=timestamp("When the node removes it unless something references it again."),
        ),
        "Content on the node, one entry per digest.",
        max_items=256,
        list_type="map",
        list_map_keys=("digest",),
    ),
    conditions=conditions(),
)

NODE_MODEL_STORE = ResourceKind(
    kind="NodeModelStore",
    plural="nodemodelstores",
    singular="nodemodelstore",
    namespaced=False,
    description="The model cache of one node (named after it): what the node is asked to hold and what it "
    "holds. Names no tenant.",
    spec=_NODE_MODEL_STORE_SPEC,
    status=_NODE_MODEL_STORE_STATUS,
    columns=(
        Column("Ready", "integer", "Models published on the node.", object_render=lambda o: store_models(o, "Ready")),
        Column(
            "Cache",
            "string",
            "Bytes the model cache holds.",
            fields=(Field("Stored", ".status.capacity.storedBytes", "integer", "Bytes the cache holds.", 0),),
            render=lambda v: human_bytes(v.get("Stored") or 0),
        ),
        Column(
            "Volume",
            "string",
            "The cache volume's used percent of its size, whatever else shares it: what the watermarks and "
            "CapacityLow go by.",
            fields=(
                Field("Total", ".status.capacity.totalBytes", "integer", "Bytes of the cache's volume."),
                Field("Used Percent", ".status.capacity.usedPercent", "integer", "Percent of the volume in use."),
            ),
            render=lambda v: volume_used(v.get("Total") or 0, v.get("Used Percent") or 0),
        ),
        Column("Models", "integer", "Models on the node.", object_render=store_models),
        Column(
            "Downloading",
            "integer",
            "Models downloading.",
            object_render=lambda o: store_models(o, "Downloading"),
        ),
        age_column(),
    ),
    verbs=("delete", "get", "list", "watch"),
    short_names=("nms",),
    spec_required=False,
)
