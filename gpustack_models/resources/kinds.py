"""The one definition of each resource kind of ``worker.gpustack.ai``.

Each ``ResourceKind`` below drives the v1alpha1 storage CRD (schema, CEL rules, printer columns), the
public v1 API's discovery (verbs, short names, categories), its OpenAPI document and its Table columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .formatting import human_bytes
from .schema import (
    Rule,
    Schema,
    array,
    boolean,
    conditions,
    digest,
    integer,
    label_selector,
    obj,
    object_name,
    string,
    timestamp,
)

GROUP = "worker.gpustack.ai"
STORAGE_VERSION = "v1alpha1"
PUBLIC_VERSION = "v1"
CATEGORY = "gpustack"


@dataclass(frozen=True)
class Field:
    """A raw value kube-apiserver reads with JSONPath: one printer column of the storage CRD.

    The v1 Table is rendered from these raw cells (kube-apiserver's own Table of the CRD), so a list never
    has to be decoded object by object in Python.
    """

    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 1

    def to_crd(self) -> dict:
        out = {
            "name": self.name,
            "type": self.type,
            "jsonPath": self.json_path,
            "description": self.description or f"Raw {self.json_path} for the v1 columns.",
        }
        if self.priority:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True)
class Column:
    """A v1 printer column.

    ``fields`` are the raw values it needs and ``render`` turns them (a dict by field name) into the
    cell. A column JSONPath cannot feed (counting list entries) has ``object_render`` instead, taking the
    whole object; a kind with such a column renders its Tables from full objects.
    """

    name: str
    type: str
    description: str
    fields: tuple[Field, ...] = ()
    render: Callable[[dict], object] | None = None
    object_render: Callable[[dict], object] | None = None
    priority: int = 0

    def to_table(self) -> dict:
        return {
            "name": self.name,
            "type": self.type,
            "format": "",
            "description": self.description,
            "priority": self.priority,
        }


@dataclass(frozen=True)
class ResourceKind:
    kind: str
    plural: str
    singular: str
    namespaced: bool
    description: str
    spec: Schema
    status: Schema
    columns: tuple[Column, ...]
    verbs: tuple[str, ...]
    short_names: tuple[str, ...]
    categories: tuple[str, ...] = (CATEGORY,)
    subresources: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (name, kind, verbs) in v1
    spec_required: bool = True

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def fields(self) -> tuple[Field, ...]:
        """The storage CRD's printer columns: every raw field of the v1 columns, once, in order."""
        seen: dict[str, Field] = {}
        for column in self.columns:
            for f in column.fields:
                seen.setdefault(f.name, f)
        return tuple(seen.values())

    @property
    def table_from_fields(self) -> bool:
        return all(c.object_render is None for c in self.columns)

    @property
    def scope(self) -> str:
        return "Namespaced" if self.namespaced else "Cluster"

    def object_schema(self) -> Schema:
        """The whole object: apiVersion, kind, metadata, spec, status."""
        return obj(
            self.description,
            required=("spec",) if self.spec_required else (),
            apiVersion=string("APIVersion defines the versioned schema of this representation of an object."),
            kind=string("Kind is a string value representing the REST resource this object represents."),
            metadata=Schema("object"),
            spec=self.spec,
            status=self.status,
        )


# --- Table cell renderers ----------------------------------------------------------------------------


def _get(obj_: dict, *path, default=None):
    cur = obj_
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return default
        cur = cur[key]
    return cur


def artifact_source(v: dict) -> str:
    if v.get("HF Repository"):
        return f"hf:{v['HF Repository']}"
    if v.get("MS Repository"):
        return f"ms:{v['MS Repository']}"
    if v.get("Claim"):
        return f"pvc:{v['Claim']}" + (f"/{v['Claim Path']}" if v.get("Claim Path") else "")
    return ""


def artifact_revision(v: dict) -> str:
    return (v.get("Revision") or v.get("HF Revision") or v.get("MS Revision") or "")[:12]


def artifact_resolved(v: dict) -> str:
    status = v.get("Resolved")
    if status is None:
        return "Unknown"
    return "True" if status == "True" else (v.get("Resolved Reason") or status)


def _count(name: str) -> Callable[[dict], int]:
    return lambda v: v.get(name) or 0


def store_models(obj_: dict, state: str | None = None) -> int:
    models = _get(obj_, "status", "models", default=[]) or []
    return sum(1 for m in models if state is None or m.get("state") == state)


AGE = Field("Age", ".metadata.creationTimestamp", "date", "Time since the object was created.")


def age_column() -> Column:
    # kube-apiserver renders date columns as kubectl-style ages; v1 shows Age only with -o wide.
    return Column(
        "Age",
        "string",
        "Time since the object was created.",
        fields=(AGE,),
        render=lambda v: v.get("Age") or "<unknown>",
        priority=1,
    )


# --- ModelArtifact -----------------------------------------------------------------------------------

SECRET_REF = obj(
    "A Secret in the artifact's namespace whose key `token` is sent to the hub. The creator must be "
    "allowed to read it.",
    required=("name",),
    name=object_name("Name of the Secret."),
)

REPOSITORY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)?$"

PATTERNS_LIMIT = 32
PATTERN_LENGTH = 256


def _patterns(description: str) -> Schema:
    return array(
        string(min_length=1, max_length=PATTERN_LENGTH),
        description,
        max_items=PATTERNS_LIMIT,
        list_type="atomic",
    )


def _hub_source(hub: str, example: str, default_revision: str) -> Schema:
    return obj(
        f"A {hub} model repository at a revision.",
        required=("repository",),
        repository=string(
            f"The repository id, e.g. `{example}`.",
            pattern=REPOSITORY_PATTERN,
            min_length=1,
            max_length=256,
        ),
        revision=string(
            f"A branch, tag or full commit. Defaults to `{default_revision}`; resolved once to a commit.",
            default=default_revision,
            min_length=1,
            max_length=256,
        ),
        secretRef=SECRET_REF,
    )


_MODEL_ARTIFACT_SPEC = obj(
    "What the artifact is: a source and, for hub sources, which of its files. Immutable after creation.",
    required=("source",),
    rules=(
        Rule("self == oldSelf", "spec is immutable after creation"),
        Rule(
            "!has(self.source.persistentVolumeClaim) || !has(self.allowPatterns)",
            "allowPatterns apply to hub sources only",
            field_path=".allowPatterns",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.source.persistentVolumeClaim) || !has(self.ignorePatterns)",
            "ignorePatterns apply to hub sources only",
            field_path=".ignorePatterns",
            reason="FieldValueForbidden",
        ),
        Rule(
            "!has(self.source.persistentVolumeClaim) || !has(self.expectedDigest)",
            "expectedDigest applies to hub sources only",
            field_path=".expectedDigest",
            reason="FieldValueForbidden",
        ),
    ),
    source=obj(
        "Where the files come from: exactly one of huggingFace, modelScope, persistentVolumeClaim.",
        rules=(
            Rule(
                "[has(self.huggingFace), has(self.modelScope), has(self.persistentVolumeClaim)]"
                ".filter(x, x).size() == 1",
                "exactly one of huggingFace, modelScope or persistentVolumeClaim must be set",
            ),
        ),
        huggingFace=_hub_source("Hugging Face", "Qwen/Qwen2.5-7B-Instruct", "main"),
        modelScope=_hub_source("ModelScope", "qwen/Qwen2.5-7B-Instruct", "master"),
        persistentVolumeClaim=obj(
            "A PersistentVolumeClaim in the artifact's namespace holding the files; mounted, never downloaded.",
            required=("claimName",),
            claimName=object_name("Name of the claim."),
            path=string(
                "A relative directory inside the claim; the claim's root when empty.",
                pattern=r"^[^/](.*[^/])?$",
                max_length=1024,
                rules=(
                    Rule(
                        "!self.split('/').exists(s, s == '' || s == '.' || s == '..')",
                        "path must be relative, without empty, '.' or '..' segments",
                    ),
                ),
            ),
        ),
    ),
    allowPatterns=_patterns(
        "Files to keep, as fnmatch patterns on the repository path; `dir/` keeps everything under dir. "
        f"Hub sources only; at most {PATTERNS_LIMIT} patterns of 1 to {PATTERN_LENGTH} characters."
    ),
    ignorePatterns=_patterns("Files to drop, same syntax as allowPatterns; wins over allowPatterns. Hub sources only."),
    expectedDigest=digest(
        "The manifest digest resolution must produce (`sha256:` and 64 lowercase hex digits); "
        "resolution fails with DigestMismatch otherwise. Hub sources only."
    ),
)

_MODEL_ARTIFACT_STATUS = obj(
    "What the service observed: the resolved content and how many nodes hold it.",
    observedGeneration=integer("The generation last processed.", int64=True, minimum=0),
    resolved=obj(
        "The immutable content the artifact resolved to.",
        revision=string("The commit the revision resolved to (40 hex characters on hubs).", max_length=256),
        manifestDigest=digest("sha256 of the canonical manifest: the content identity shared across namespaces."),
        fileCount=integer("Number of selected files.", int64=True, minimum=0),
        sizeBytes=integer("Total size of the selected files in bytes.", int64=True, minimum=0),
    ),
    nodes=obj(
        "Nodes holding the content, rolled up on thresholds; the progress subresource is exact.",
        ready=integer("Nodes holding the content published.", minimum=0),
        downloading=integer("Nodes downloading it.", minimum=0),
        failed=integer("Nodes waiting to retry a failed attempt.", minimum=0),
        downloadingPercent=integer(
            "Mean percent of the downloading nodes; absent while none downloads.", minimum=0, maximum=100
        ),
    ),
    conditions=conditions(),
)

MODEL_ARTIFACT = ResourceKind(
    kind="ModelArtifact",
    plural="modelartifacts",
    singular="modelartifact",
    namespaced=True,
    description="A model's files from a Hugging Face or ModelScope repository at a revision, or a volume "
    "claim, resolved once to an immutable content digest and cached on GPU nodes.",
    spec=_MODEL_ARTIFACT_SPEC,
    status=_MODEL_ARTIFACT_STATUS,
    columns=(
        Column(
            "Source",
            "string",
            "Where the files come from.",
            fields=(
                Field("HF Repository", ".spec.source.huggingFace.repository"),
                Field("MS Repository", ".spec.source.modelScope.repository"),
                Field("Claim", ".spec.source.persistentVolumeClaim.claimName"),
                Field("Claim Path", ".spec.source.persistentVolumeClaim.path"),
            ),
            render=artifact_source,
        ),
        Column(
            "Revision",
            "string",
            "The resolved commit (first 12 characters), or the requested revision until resolved.",
            fields=(
                Field("Revision", ".status.resolved.revision", description="The resolved commit.", priority=0),
                Field("HF Revision", ".spec.source.huggingFace.revision"),
                Field("MS Revision", ".spec.source.modelScope.revision"),
            ),
            render=artifact_revision,
        ),
        Column(
            "Size",
            "string",
            "Total size of the selected files.",
            fields=(Field("Size", ".status.resolved.sizeBytes", "integer", "Bytes of the selected files.", 0),),
            render=lambda v: human_bytes(v.get("Size")),
        ),
        Column(
            "Ready",
            "integer",
            "Nodes holding the content.",
            fields=(Field("Ready", ".status.nodes.ready", "integer", "Nodes holding the content.", 0),),
            render=_count("Ready"),
        ),
        Column(
            "Downloading",
            "integer",
            "Nodes downloading the content.",
            fields=(Field("Downloading", ".status.nodes.downloading", "integer", "Nodes downloading it.", 0),),
            render=_count("Downloading"),
        ),
        Column(
            "Resolved",
            "string",
            "True once resolved, else the reason.",
            fields=(
                Field(
                    "Resolved", '.status.conditions[?(@.type=="Resolved")].status', description="Resolved.", priority=0
                ),
                Field("Resolved Reason", '.status.conditions[?(@.type=="Resolved")].reason'),
            ),
            render=artifact_resolved,
        ),
        age_column(),
    ),
    verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
    short_names=("mart",),
    subresources=(("progress", "ModelArtifactProgress", ("get",)),),
)

# --- NodeModelStore ----------------------------------------------------------------------------------

_MODEL_STATES = ("Downloading", "Ready", "Failed")
FAILURE_REASONS = (
    "InvalidRequest",
    "AccessDenied",
    "SourceUnavailable",
    "IntegrityMismatch",
    "InsufficientCapacity",
    "Canceled",
)

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
        concurrency=integer("Parallel connections across all downloads.", default=8, minimum=1, maximum=256),
        bytesPerSecond=integer(
            "Total bandwidth cap in bytes per second; 0 for none.", int64=True, default=0, minimum=0
        ),
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
            state=string("Downloading, Ready or Failed.", enum=_MODEL_STATES),
            sizeBytes=integer("Total size of the content.", int64=True, minimum=0),
            downloadedBytes=integer("Bytes downloaded and verified so far.", int64=True, minimum=0),
            reason=string("Why it failed: " + ", ".join(FAILURE_REASONS) + ".", max_length=64),
            message=string("Details of the failure.", max_length=4096),
            retryTime=timestamp("Earliest next attempt after a failure."),
            lastUsedTime=timestamp("When the content was last used."),
            source=string("Where the bytes came from.", enum=("Hub", "Peer")),
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
            "Used",
            "string",
            "Bytes the cache holds.",
            fields=(Field("Stored", ".status.capacity.storedBytes", "integer", "Bytes the cache holds.", 0),),
            render=lambda v: human_bytes(v.get("Stored") or 0),
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

# --- ModelPrefetch -----------------------------------------------------------------------------------

_MODEL_PREFETCH_SPEC = obj(
    "Which artifact to warm on which nodes.",
    required=("artifactRef",),
    rules=(
        Rule(
            "has(self.nodeNames) != has(self.nodeSelector)",
            "exactly one of nodeNames or nodeSelector must be set",
        ),
    ),
    artifactRef=obj(
        "A ModelArtifact in the prefetch's namespace.",
        required=("name",),
        name=object_name("Name of the ModelArtifact."),
    ),
    nodeNames=array(
        object_name("A node name."),
        "Nodes to warm, by name.",
        max_items=1024,
        list_type="set",
    ),
    nodeSelector=label_selector("Nodes to warm, by label."),
    minReady=integer("Nodes that must be ready for Available; 0 means all.", default=0, minimum=0),
    retention=obj(
        "How long the nodes keep the content.",
        pinned=boolean("Keep it regardless of disk pressure while the prefetch exists.", default=False),
        ttlAfterLastUse=string(
            "Keep it this long after last use (Go duration, e.g. 24h).",
            default="24h",
            pattern=r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$",
            max_length=64,
        ),
    ),
)

_MODEL_PREFETCH_STATUS = obj(
    "How far the prefetch is.",
    observedGeneration=integer("The generation last processed.", int64=True, minimum=0),
    desiredNodes=integer("Nodes the prefetch selects.", minimum=0),
    readyNodes=integer("Selected nodes holding the content.", minimum=0),
    downloadingNodes=integer("Selected nodes downloading it.", minimum=0),
    conditions=conditions(),
)

MODEL_PREFETCH = ResourceKind(
    kind="ModelPrefetch",
    plural="modelprefetches",
    singular="modelprefetch",
    namespaced=True,
    description="Warms an artifact's content on named or selected nodes ahead of use.",
    spec=_MODEL_PREFETCH_SPEC,
    status=_MODEL_PREFETCH_STATUS,
    columns=(
        Column(
            "Artifact",
            "string",
            "The ModelArtifact.",
            fields=(Field("Artifact", ".spec.artifactRef.name", description="The ModelArtifact.", priority=0),),
            render=lambda v: v.get("Artifact") or "",
        ),
        Column(
            "Desired",
            "integer",
            "Nodes selected.",
            fields=(Field("Desired", ".status.desiredNodes", "integer", "Nodes selected.", 0),),
            render=_count("Desired"),
        ),
        Column(
            "Ready",
            "integer",
            "Nodes holding the content.",
            fields=(Field("Ready", ".status.readyNodes", "integer", "Nodes holding the content.", 0),),
            render=_count("Ready"),
        ),
        Column(
            "Downloading",
            "integer",
            "Nodes downloading it.",
            fields=(Field("Downloading", ".status.downloadingNodes", "integer", "Nodes downloading it.", 0),),
            render=_count("Downloading"),
        ),
        Column(
            "Available",
            "string",
            "Whether enough nodes are ready.",
            fields=(
                Field(
                    "Available",
                    '.status.conditions[?(@.type=="Available")].status',
                    description="Available.",
                    priority=0,
                ),
            ),
            render=lambda v: v.get("Available") or "Unknown",
        ),
        age_column(),
    ),
    verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
    short_names=("mpf",),
)

KINDS: tuple[ResourceKind, ...] = (MODEL_ARTIFACT, NODE_MODEL_STORE, MODEL_PREFETCH)
BY_PLURAL = {k.plural: k for k in KINDS}
BY_KIND = {k.kind: k for k in KINDS}
