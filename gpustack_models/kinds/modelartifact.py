"""ModelArtifact: a model's files at a source, resolved once to a content digest."""

from __future__ import annotations

from gpustack_models.kinds.base import (
    Column,
    Field,
    ResourceKind,
    age_column,
    artifact_commit,
    artifact_resolved,
    artifact_revision,
    artifact_source,
    count_column,
    count_of,
)
from gpustack_models.kinds.formatting import human_bytes, human_duration
from gpustack_models.kinds.oci_reference import OCI_REFERENCE_PATTERN
from gpustack_models.kinds.schema import Rule, Schema, array, conditions, digest, integer, obj, object_name, string

SECRET_REF = obj(
    "A Secret in the artifact's namespace whose key `token` is sent to the hub. The creator must be "
    "allowed to read it.",
    required=("name",),
    name=object_name("Name of the Secret."),
)

DOCKER_CONFIG_SECRET_REF = obj(
    "A Secret of type kubernetes.io/dockerconfigjson in the artifact's namespace whose `.dockerconfigjson` "
    "holds credentials for the registry (its `auths` entry for the registry's host). The creator must be "
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


def _hub_source(hub: str, example: str, default_revision: str | None) -> Schema:
    """``default_revision`` None: the resolver takes the repository's default branch (ModelScope's
    repositories are on ``master`` or ``main``)."""
    said = (
        f"Defaults to `{default_revision}`"
        if default_revision
        else "Defaults to the repository's default branch (`master`, else `main`, else its only branch)"
    )
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
            f"A branch, tag or full commit. {said}; resolved once to a commit.",
            default=default_revision,
            min_length=1,
            max_length=256,
        ),
        secretRef=SECRET_REF,
    )


def _relative_path(description: str) -> Schema:
    return string(
        description,
        pattern=r"^[^/](.*[^/])?$",
        max_length=1024,
        rules=(
            Rule(
                "!self.split('/').exists(s, s == '' || s == '.' || s == '..')",
                "path must be relative, without empty, '.' or '..' segments",
            ),
        ),
    )


_OCI_SOURCE = obj(
    "An OCI artifact in a registry whose layers are the model's files, named by their "
    "`org.cncf.model.filepath` or `org.opencontainers.image.title` annotation (the CNCF ModelPack format, "
    "or `oras push` of the files). A tag is resolved once to the manifest digest; an index picks the "
    "manifest of the service's platform.",
    required=("reference",),
    reference=string(
        "`registry/repository:tag` or `registry/repository@sha256:<hex>`, e.g. "
        "`registry.example.com/models/qwen2.5-7b:v1`.",
        pattern=f"^{OCI_REFERENCE_PATTERN}$",
        min_length=1,
        max_length=512,
    ),
    path=_relative_path("Only the files under this directory of the artifact, named relative to it."),
    secretRef=DOCKER_CONFIG_SECRET_REF,
)


S3_SECRET_REF = obj(
    "A Secret in the artifact's namespace with the keys `accessKeyId` and `secretAccessKey` (or "
    "`AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`). Without it requests are unsigned (a public bucket). The "
    "creator must be allowed to read it; nodes never get it (they get pre-signed links of the pinned objects).",
    required=("name",),
    name=object_name("Name of the Secret."),
)

_S3_SOURCE = obj(
    "The objects under a prefix of a bucket in S3-compatible storage, each a file named by the rest of its key. "
    "Each object is pinned at resolution by its version (where the bucket keeps versions) and its ETag.",
    required=("endpoint", "bucket"),
    endpoint=string(
        "The store's URL, e.g. `https://s3.us-east-1.amazonaws.com` or `http://minio.storage:9000`; buckets "
        "are addressed by path.",
        pattern=r"^https?://[^/?#@\s]+/?$",
        max_length=2048,
    ),
    bucket=string("The bucket.", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", min_length=3, max_length=63),
    prefix=_relative_path("A directory of keys (`models/qwen2.5-7b`); the bucket's root when empty."),
    region=string("The region requests are signed for.", default="us-east-1", min_length=1, max_length=64),
    secretRef=S3_SECRET_REF,
)


_MODEL_ARTIFACT_SPEC = obj(
    "What the artifact is: a source and, for hub sources, which of its files. Immutable after creation.",
    required=("source",),
    rules=(
        Rule(
            "self == oldSelf",
            "spec is immutable after creation: to fetch another repository, revision or set of files, delete "
            "this ModelArtifact and create it again (or create one under a new name); to resolve a branch or "
            "tag that moved, set the annotation worker.gpustack.ai/requested-at to a new value",
        ),
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
        "Where the files come from: exactly one of huggingFace, modelScope, oci, s3, persistentVolumeClaim.",
        rules=(
            Rule(
                "[has(self.huggingFace), has(self.modelScope), has(self.oci), has(self.s3),"
                " has(self.persistentVolumeClaim)].filter(x, x).size() == 1",
                "exactly one of huggingFace, modelScope, oci, s3 or persistentVolumeClaim must be set",
            ),
        ),
        huggingFace=_hub_source("Hugging Face", "Qwen/Qwen2.5-7B-Instruct", "main"),
        modelScope=_hub_source("ModelScope", "qwen/Qwen2.5-7B-Instruct", None),
        oci=_OCI_SOURCE,
        s3=_S3_SOURCE,
        persistentVolumeClaim=obj(
            "A PersistentVolumeClaim in the artifact's namespace holding the files; mounted, never downloaded.",
            required=("claimName",),
            claimName=object_name("Name of the claim."),
            path=_relative_path("A relative directory inside the claim; the claim's root when empty."),
        ),
    ),
    allowPatterns=_patterns(
        "Files to keep, as fnmatch patterns on the repository path; `dir/` keeps everything under dir. "
        f"Hub and registry sources only; at most {PATTERNS_LIMIT} patterns of 1 to {PATTERN_LENGTH} characters."
    ),
    ignorePatterns=_patterns(
        "Files to drop, same syntax as allowPatterns; wins over allowPatterns. Hub and registry sources only."
    ),
    expectedDigest=digest(
        "The manifest digest resolution must produce (`sha256:` and 64 lowercase hex digits); "
        "resolution fails with DigestMismatch otherwise. Hub and registry sources only."
    ),
)

_MODEL_ARTIFACT_STATUS = obj(
    "What the service observed: the resolved content and how many nodes hold it.",
    observedGeneration=integer("The generation last processed.", int64=True, minimum=0),
    resolved=obj(
        "The immutable content the artifact resolved to.",
        revision=string(
            "The commit the revision resolved to (40 hex characters on hubs; the manifest digest in a registry).",
            max_length=256,
        ),
        manifestDigest=digest("sha256 of the canonical manifest: the content identity shared across namespaces."),
        fileCount=integer("Number of selected files.", int64=True, minimum=0),
        sizeBytes=integer("Total size of the selected files in bytes.", int64=True, minimum=0),
    ),
    nodes=obj(
        "Nodes holding the content, among those it was placed on (a node's report of content it was not given "
        "counts for nothing), rolled up on thresholds; the progress subresource is exact.",
        ready=integer(
            "Nodes holding the content published. Content is shared across namespaces by manifestDigest: this "
            "counts every node holding it, including copies placed there for another namespace's artifact or "
            "prefetch of the same content.",
            minimum=0,
        ),
        downloading=integer("Nodes downloading it.", minimum=0),
        failed=integer("Nodes waiting to retry a failed attempt.", minimum=0),
        downloadingPercent=integer(
            "Mean percent of the downloading nodes; absent while none downloads.", minimum=0, maximum=100
        ),
    ),
    conditions=conditions(),
)

_MS_REPOSITORY = Field("MS Repository", ".spec.source.modelScope.repository")

MODEL_ARTIFACT = ResourceKind(
    kind="ModelArtifact",
    plural="modelartifacts",
    singular="modelartifact",
    namespaced=True,
    description="A model's files from a Hugging Face or ModelScope repository at a revision, an OCI "
    "artifact in a registry, objects in S3-compatible storage, or a volume claim, resolved once to an immutable "
    "content digest and cached on GPU nodes.",
    spec=_MODEL_ARTIFACT_SPEC,
    status=_MODEL_ARTIFACT_STATUS,
    columns=(
        Column(
            "Source",
            "string",
            "Where the files come from.",
            fields=(
                Field("HF Repository", ".spec.source.huggingFace.repository"),
                _MS_REPOSITORY,
                Field("OCI Reference", ".spec.source.oci.reference"),
                Field("S3 Bucket", ".spec.source.s3.bucket"),
                Field("S3 Prefix", ".spec.source.s3.prefix"),
                Field("Claim", ".spec.source.persistentVolumeClaim.claimName"),
                Field("Claim Path", ".spec.source.persistentVolumeClaim.path"),
            ),
            render=artifact_source,
        ),
        Column(
            "Revision",
            "string",
            "The revision asked for: a branch, tag or commit ('(default)': the ModelScope repository's default "
            "branch).",
            fields=(
                Field("HF Revision", ".spec.source.huggingFace.revision"),
                Field("MS Revision", ".spec.source.modelScope.revision"),
                _MS_REPOSITORY,
            ),
            render=artifact_revision,
        ),
        Column(
            "Commit",
            "string",
            "The commit the revision resolved to (first 12 characters); empty until resolved.",
            fields=(Field("Revision", ".status.resolved.revision", description="The resolved commit.", priority=0),),
            render=artifact_commit,
        ),
        Column(
            "Size",
            "string",
            "Total size of the selected files.",
            fields=(Field("Size", ".status.resolved.sizeBytes", "integer", "Bytes of the selected files.", 0),),
            render=lambda v: human_bytes(v.get("Size")),
        ),
        count_column("Ready", ".status.nodes.ready", "Nodes holding the content."),
        count_column(
            "Downloading", ".status.nodes.downloading", "Nodes downloading the content.", "Nodes downloading it."
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
    subresources=(("progress", "ModelArtifactProgress", ("get",)), ("files", "ModelArtifactFiles", ("get",))),
)


# --- The progress subresource's Table --------------------------------------------------------------
# Its cells come from the ``ModelArtifactProgress`` answer (computed per request, never stored), so
# every column renders from that whole object.


def progress_percent(progress: dict) -> str:
    percent = progress.get("downloadingPercent")
    return "" if percent is None else f"{percent}%"


def progress_bytes(progress: dict) -> str:
    """What the downloading nodes hold, of what they fetch in all (the content's size on each)."""
    downloading = progress.get("downloading") or 0
    if not downloading:
        return ""
    total = (progress.get("sizeBytes") or 0) * downloading
    return f"{human_bytes(progress.get('downloadingBytes') or 0)}/{human_bytes(total)}"


def progress_rate(progress: dict) -> str:
    rate = progress.get("bytesPerSecond")
    return "" if rate is None else f"{human_bytes(rate)}/s"


def progress_eta(progress: dict) -> str:
    eta = progress.get("etaSeconds")
    return "" if eta is None else human_duration(eta)


def progress_failures(progress: dict) -> str:
    return ",".join(f"{r['reason']}:{r['count']}" for r in progress.get("failureReasons") or ())


PROGRESS_COLUMNS = (
    Column("Ready", "integer", "Nodes holding the content.", object_render=count_of("ready")),
    Column("Downloading", "integer", "Nodes downloading it.", object_render=count_of("downloading")),
    Column("Failed", "integer", "Nodes waiting to retry a failed attempt.", object_render=count_of("failed")),
    Column("Percent", "string", "Mean percent of the downloading nodes.", object_render=progress_percent),
    Column(
        "Bytes",
        "string",
        "Bytes the downloading nodes hold, of the content's size times the downloading nodes.",
        object_render=progress_bytes,
    ),
    Column("Rate", "string", "Bytes per second the live downloading nodes receive.", object_render=progress_rate),
    Column("ETA", "string", "Until the last downloading node holds it, at its rate.", object_render=progress_eta),
    Column(
        "Live",
        "integer",
        "Downloading nodes whose bytes were read from the node just now.",
        object_render=count_of("live"),
    ),
    Column(
        "Digest",
        "string",
        "The content digest (its first 12 hex characters).",
        object_render=lambda p: (p.get("manifestDigest") or "")[:19],
        priority=1,
    ),
    Column("Failures", "string", "Failed nodes by reason.", object_render=progress_failures, priority=1),
    Column(
        "Reason",
        "string",
        "Why no node counts: the content is on a claim, or not resolved yet.",
        object_render=lambda p: p.get("reason") or "",
        priority=1,
    ),
)


# --- The files subresource's Table: a row per file of the resolved manifest ---------------------------

FILES_COLUMNS = (
    Column("Path", "string", "The file's path in the content.", object_render=lambda f: f["path"]),
    Column("Size", "string", "The file's size.", object_render=lambda f: human_bytes(f["sizeBytes"])),
    Column(
        "Digest",
        "string",
        "What the file is verified against (sha256 of its bytes, or git's blob hash for a small file).",
        object_render=lambda f: f["digest"],
        priority=1,
    ),
)
