"""ModelPrefetch: warms an artifact's content on named or selected nodes ahead of use."""

from __future__ import annotations

from gpustack_models.kinds.base import Column, Field, ResourceKind, age_column, count_column
from gpustack_models.kinds.schema import (
    Rule,
    array,
    boolean,
    conditions,
    integer,
    label_selector,
    obj,
    object_name,
    string,
)

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
    readyNodes=integer("Selected nodes holding the content (lapsed ones not counted).", minimum=0),
    downloadingNodes=integer("Selected nodes downloading it.", minimum=0),
    lapsedNodes=integer(
        "Selected nodes where retention.ttlAfterLastUse ran out: the content is collected there until the "
        "prefetch's spec changes.",
        minimum=0,
    ),
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
        count_column("Desired", ".status.desiredNodes", "Nodes selected."),
        count_column("Ready", ".status.readyNodes", "Nodes holding the content."),
        count_column("Downloading", ".status.downloadingNodes", "Nodes downloading it."),
        count_column(
            "Lapsed",
            ".status.lapsedNodes",
            "Nodes where retention.ttlAfterLastUse ran out (changing the spec places it again).",
            "Nodes where the retention ran out.",
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
