"""The mirror: what the informers last saw of the cluster, plus what resolution learned.

Kubernetes is the store of record; these rows are rebuilt from it at any time. Each mirrored row keeps the
resourceVersion it was written from and only ever moves forward, so the tasks that write it may run twice
or out of order. A deleted object leaves a tombstone (``deleted``) carrying the deletion's
resourceVersion, so an older event arriving late cannot bring it back; tombstones are purged later.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Exists, OuterRef, Q

from gpustack_models.kinds import nodemodelstore


class EntryState(models.TextChoices):
    """The state of a digest on a node (NodeModelStore ``status.models[].state``)."""

    DOWNLOADING = nodemodelstore.DOWNLOADING, "Downloading"
    READY = nodemodelstore.READY, "Ready"
    FAILED = nodemodelstore.FAILED, "Failed"


class EntrySource(models.TextChoices):
    """Where most of a digest's bytes on a node came from."""

    HUB = nodemodelstore.SOURCE_HUB, "Hub"
    PEER = nodemodelstore.SOURCE_PEER, "Peer"


class ConditionStatus(models.TextChoices):
    TRUE = "True", "True"
    FALSE = "False", "False"
    UNKNOWN = "Unknown", "Unknown"


class SourceKind(models.TextChoices):
    """The member of a ModelArtifact's ``spec.source``."""

    HUGGING_FACE = "huggingFace", "Hugging Face"
    MODEL_SCOPE = "modelScope", "ModelScope"
    OCI = "oci", "OCI registry"
    S3 = "s3", "S3"
    CLAIM = "persistentVolumeClaim", "PersistentVolumeClaim"


class MirroredQuerySet(models.QuerySet):
    def live(self):
        return self.filter(deleted=False)


def tombstones(prefix: str) -> models.Index:
    """The index the tombstone purge reads (deleted rows by age), holding the tombstones only."""
    return models.Index(fields=["updated_at"], condition=Q(deleted=True), name=f"{prefix}_tombstones")


class Mirrored(models.Model):
    resource_version = models.BigIntegerField()
    uid = models.CharField(max_length=64, blank=True)
    deleted = models.BooleanField(default=False)
    body = models.JSONField(default=dict, help_text="The object as last seen, without managedFields.")
    updated_at = models.DateTimeField(auto_now=True)

    objects = MirroredQuerySet.as_manager()

    class Meta:
        abstract = True


class Artifact(Mirrored):
    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    generation = models.BigIntegerField(default=0)
    source = models.CharField(max_length=32, blank=True, choices=SourceKind.choices)
    repository = models.CharField(max_length=1024, blank=True)
    revision = models.CharField(max_length=256, blank=True)
    digest = models.CharField(max_length=71, blank=True, db_index=True, help_text="status.resolved.manifestDigest")
    resolved_revision = models.CharField(max_length=256, blank=True)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    file_count = models.IntegerField(null=True, blank=True)
    resolved_status = models.CharField(
        max_length=16, blank=True, choices=ConditionStatus.choices, help_text="The Resolved condition's status"
    )
    resolved_reason = models.CharField(max_length=64, blank=True)
    nodes = models.JSONField(default=dict, blank=True, help_text="status.nodes as last written")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="artifact_namespace_name")]
        indexes = [
            models.Index(fields=["namespace", "resolved_status"]),
            tombstones("artifact"),
            # The mount check's artifacts still carrying a finalizer: few, found without reading the rest.
            models.Index(
                fields=["namespace", "name"],
                condition=Q(body__metadata__has_key="finalizers"),
                name="artifact_finalizers",
            ),
        ]

    def __str__(self):
        return f"{self.namespace}/{self.name}"


class Manifest(models.Model):
    """A resolved file list, shared by every artifact whose content has this digest."""

    digest = models.CharField(max_length=71, primary_key=True)
    files = models.JSONField(help_text="[{path, size, algorithm, hexdigest, lfs}] sorted by path")
    file_count = models.IntegerField()
    size_bytes = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return self.digest


class Resolution(models.Model):
    """Where an artifact's content comes from: enough for the node plugin's fetch ticket."""

    artifact = models.OneToOneField(Artifact, on_delete=models.CASCADE, related_name="resolution")
    artifact_uid = models.CharField(
        max_length=64, blank=True, help_text="The uid of the object it was computed for (a recreated one differs)"
    )
    generation = models.BigIntegerField()
    manifest = models.ForeignKey(Manifest, on_delete=models.PROTECT, related_name="resolutions")
    source = models.CharField(max_length=32)
    endpoint = models.CharField(max_length=2048)
    repository = models.CharField(max_length=1024)
    commit = models.CharField(max_length=256)
    secret_name = models.CharField(max_length=253, blank=True)
    objects_pinned = models.JSONField(
        default=dict,
        db_default={},  # rows written by a version without the column (a rolling upgrade) get one too
        blank=True,
        help_text="Where a source keeps each file's bytes, pinned at resolution: an S3 source's region and objects "
        "(key, ETag, version); a registry's files inside tar layers (layer, offset)",
    )
    resolved_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.artifact}: {self.source} {self.repository}@{self.commit}"


class NodeStore(Mirrored):
    name = models.CharField(max_length=253, unique=True)
    spec_models = models.JSONField(default=list, blank=True, help_text="spec.models")
    total_bytes = models.BigIntegerField(default=0)
    stored_bytes = models.BigIntegerField(default=0)
    used_percent = models.IntegerField(default=0)

    class Meta:
        indexes = [tombstones("nodestore")]

    def __str__(self):
        return self.name


class StoreEntryQuerySet(models.QuerySet):
    def claimed(self, digests=None):
        """The entries whose digest the service placed on their node: a ``Holding`` (the digest is in the
        node's ``spec.models``, or held there under the collection grace). A node's report is a claim about
        itself only: an entry for a digest it was never given counts nowhere a tenant sees (roll-ups,
        ``progress``, fetch tickets' peers, Pods' affinity, prefetches' status). Decided at read time, so
        an entry reported before its digest was placed counts from the placement on, and stops counting
        when the digest leaves ``spec.models``. ``digests``: the caller reads the entries of those only (the
        database then reads only their holdings)."""
        held = Holding.objects.filter(node=OuterRef("node"), digest=OuterRef("digest"))
        if digests is not None:
            held = held.filter(digest__in=digests)
        return self.filter(Exists(held))


class StoreEntry(models.Model):
    """One digest on one node, from that node's NodeModelStore status.

    Only live stores have entries: the write that tombstones a store (a deletion, or a relist's prune)
    removes its entries in the same transaction, so reads of entries need no join to their store. What a
    tenant sees counts only ``claimed()`` entries; every entry stays for administrators."""

    store = models.ForeignKey(NodeStore, on_delete=models.CASCADE, related_name="entries")
    node = models.CharField(max_length=253)
    digest = models.CharField(max_length=71)
    state = models.CharField(max_length=16, choices=EntryState.choices)
    size_bytes = models.BigIntegerField(default=0)
    downloaded_bytes = models.BigIntegerField(default=0)
    reason = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)
    retry_time = models.DateTimeField(null=True, blank=True)
    last_used_time = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=8, blank=True, choices=EntrySource.choices)
    pinned = models.BooleanField(default=False)
    collect_time = models.DateTimeField(
        null=True, blank=True, help_text="When the node removes it, if nothing wants it"
    )

    objects = StoreEntryQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["store", "digest"], name="entry_store_digest")]
        indexes = [
            models.Index(fields=["digest", "state"], name="entry_digest_state"),
            models.Index(fields=["node", "state"], name="entry_node_state"),
            # The dashboard's downloads in flight and failures by reason: the few entries in those states.
            models.Index(fields=["node"], condition=Q(state="Downloading"), name="entry_downloading"),
            models.Index(fields=["reason"], condition=Q(state="Failed"), name="entry_failed"),
        ]
        verbose_name_plural = "store entries"

    def __str__(self):
        return f"{self.node}: {self.digest[:19]} {self.state}"


class Prefetch(Mirrored):
    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    artifact_name = models.CharField(max_length=253)
    node_names = models.JSONField(default=list, blank=True)
    node_selector = models.JSONField(null=True, blank=True)
    pinned = models.BooleanField(default=False)
    ttl_seconds = models.FloatField(null=True, blank=True, help_text="retention.ttlAfterLastUse")
    min_ready = models.IntegerField(default=0)
    created_at = models.DateTimeField(null=True, blank=True, help_text="metadata.creationTimestamp")
    status = models.JSONField(default=dict, blank=True, help_text="status as last written")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="prefetch_namespace_name")]
        indexes = [models.Index(fields=["namespace", "artifact_name"]), tombstones("prefetch")]
        verbose_name_plural = "prefetches"

    def __str__(self):
        return f"{self.namespace}/{self.name}"


class TargetState(models.TextChoices):
    """Where one prefetch stands on one node it targets, as the node's last reconcile decided."""

    PENDING = "Pending", "Pending"  # not decided yet (the artifact is not resolved, or no reconcile yet)
    HELD = "Held", "Held"  # in the node's spec.models
    NODE_FULL = "NodeFull", "Node full"  # left out: the node holds the most digests it may
    QUOTA_EXCEEDED = "QuotaExceeded", "Quota exceeded"  # left out: the namespace's bytes on the node
    LAPSED = "Lapsed", "Lapsed"  # retention.ttlAfterLastUse passed since the content's last use there


class PrefetchTarget(models.Model):
    """A node a prefetch targets (by name or by label selector), kept as a row per node so that a node's
    reconcile reads only the prefetches that target it, whatever their total number."""

    prefetch = models.ForeignKey(Prefetch, on_delete=models.CASCADE, related_name="targets")
    node = models.CharField(max_length=253)
    state = models.CharField(max_length=16, choices=TargetState.choices, default=TargetState.PENDING)
    lapsed_at = models.DateTimeField(null=True, blank=True)
    generation = models.BigIntegerField(default=0, help_text="The prefetch's generation the row was computed for")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["prefetch", "node"], name="target_prefetch_node")]
        indexes = [models.Index(fields=["node"], name="target_node")]

    def __str__(self):
        return f"{self.prefetch} on {self.node}: {self.state}"


class Holding(models.Model):
    """A digest in a node's ``spec.models`` as the service last decided it. ``collect_time`` is set while
    nothing references the digest there: at that time it leaves ``spec.models`` (the collection grace)."""

    node = models.CharField(max_length=253)
    digest = models.CharField(max_length=71)
    pinned = models.BooleanField(default=False)
    collect_time = models.DateTimeField(null=True, blank=True)
    added_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "digest"], name="holding_node_digest")]
        indexes = [
            models.Index(fields=["collect_time"], name="holding_collect_time"),
            models.Index(fields=["digest"], name="holding_digest"),  # a fetch ticket's peers
        ]

    def __str__(self):
        return f"{self.node}: {self.digest[:19]}"


class Namespace(Mirrored):
    """A namespace and the limit administrators set on it (annotation
    ``worker.gpustack.ai/prefetch-bytes-per-node``): the bytes its prefetches may place on one node."""

    name = models.CharField(max_length=253, unique=True)
    prefetch_bytes_per_node = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [tombstones("namespace")]

    def __str__(self):
        return self.name


class Node(Mirrored):
    name = models.CharField(max_length=253, unique=True)
    labels = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [tombstones("node")]

    def __str__(self):
        return self.name


class PluginPod(Mirrored):
    """A node plugin's Pod: which node runs the plugin, and where to reach it."""

    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    node = models.CharField(max_length=253, blank=True, db_index=True)
    pod_ip = models.CharField(max_length=64, blank=True)
    ready = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="pluginpod_namespace_name")]
        indexes = [tombstones("pluginpod")]

    def __str__(self):
        return f"{self.namespace}/{self.name}"


class ResolveBudget(models.Model):
    """A namespace's share of the hubs: resolution attempts it may still start now (a token bucket, refilled
    at ``GPUSTACK_RESOLVE_NAMESPACE_RATE`` per minute up to ``GPUSTACK_RESOLVE_NAMESPACE_BURST``), so one
    tenant's many broken artifacts cannot use up the hub's rate limit for everyone else."""

    namespace = models.CharField(max_length=253, primary_key=True)
    tokens = models.FloatField()
    refilled_at = models.DateTimeField()

    def __str__(self):
        return f"{self.namespace}: {self.tokens:.1f}"


class InformerState(models.Model):
    """Where each informer is (for the console and for tests): its last resourceVersion and relists."""

    resource = models.CharField(max_length=64, primary_key=True)
    resource_version = models.CharField(max_length=64, blank=True)
    relists = models.IntegerField(default=0)
    expired = models.IntegerField(default=0, help_text="relists caused by 410 Expired")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.resource} at {self.resource_version}"


class ResolveState(models.Model):
    """What the service remembers of an artifact's resolutions between attempts.

    A resolution that failed for a reason only a person can fix (``AccessDenied``, ``RevisionNotFound``,
    ``EmptyManifest``...) is tried again at ``retry_at``, with a backoff that doubles per failure; it is
    tried at once when the Secret it names changes (``secret_version`` is the Secret's uid and
    resourceVersion as that failure read it, empty when it was missing). ``requested_at`` is the last
    value of the artifact's ``worker.gpustack.ai/requested-at`` annotation acted upon."""

    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64, blank=True)
    failed_reason = models.CharField(max_length=64, blank=True, help_text="Empty unless the last attempt failed")
    failures = models.IntegerField(default=0, help_text="Failures in a row, for the backoff")
    retry_at = models.DateTimeField(null=True, blank=True)
    secret_name = models.CharField(max_length=253, blank=True)
    secret_version = models.CharField(max_length=128, blank=True)
    secret_checked_at = models.DateTimeField(null=True, blank=True)
    requested_at = models.CharField(max_length=256, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="resolvestate_namespace_name")]
        indexes = [
            models.Index(fields=["retry_at"], name="resolvestate_retry_at"),
            models.Index(fields=["secret_checked_at"], name="resolvestate_secret_checked"),
        ]

    def __str__(self):
        return f"{self.namespace}/{self.name}: {self.failed_reason or 'ok'}"


class EventSeries(models.Model):
    """One Kubernetes Event the service keeps counting: repeats of the same (object, type, reason, series
    key) within the series window update this Event instead of creating another."""

    object_uid = models.CharField(max_length=64)
    type = models.CharField(max_length=16)
    reason = models.CharField(max_length=128)
    series_key = models.CharField(max_length=256, blank=True)
    event_namespace = models.CharField(max_length=253)
    event_name = models.CharField(max_length=253)
    count = models.IntegerField(default=0)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["object_uid", "type", "reason", "series_key"], name="eventseries_key")
        ]
        indexes = [models.Index(fields=["last_seen"], name="eventseries_last_seen")]
        verbose_name_plural = "event series"

    def __str__(self):
        return f"{self.event_namespace}/{self.event_name} x{self.count}"


class EventBudget(models.Model):
    """An object's share of new Events (a token bucket per object, as Kubernetes' own controllers keep)."""

    object_uid = models.CharField(max_length=64, primary_key=True)
    tokens = models.FloatField()
    refilled_at = models.DateTimeField()
    suppressed = models.IntegerField(default=0, help_text="Events dropped by the rate limit")

    def __str__(self):
        return f"{self.object_uid}: {self.tokens:.1f}"


# Carried by a ModelArtifact while a Pod's volume mounts its content (as pvc-protection on a claim).
MOUNT_PROTECTION = "worker.gpustack.ai/model-artifact-protection"


class MountReference(models.Model):
    """A Pod's volume on a node that mounts an artifact's content (the node plugin asked for it when the
    kubelet published the volume): the digest is referenced on that node until the volume is released or
    the Pod is gone. While any remains, its artifact carries the finalizer
    ``worker.gpustack.ai/model-artifact-protection``, so deleting it waits for its Pods."""

    node = models.CharField(max_length=253)
    volume_id = models.CharField(max_length=128, help_text="The CSI volume id the kubelet gave the volume")
    pod_namespace = models.CharField(max_length=63)
    pod_name = models.CharField(max_length=253)
    pod_uid = models.CharField(max_length=64)
    artifact = models.CharField(max_length=253, help_text="The ModelArtifact's name, in the Pod's namespace")
    digest = models.CharField(max_length=71)
    size_bytes = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(help_text="When the plugin last asked for it, or the Pod was last found")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "volume_id"], name="mount_node_volume")]
        indexes = [
            models.Index(fields=["pod_namespace", "artifact"], name="mount_artifact"),
            models.Index(fields=["node"], name="mount_node"),
        ]

    def __str__(self):
        return f"{self.node}: {self.pod_namespace}/{self.pod_name} mounts {self.artifact} ({self.digest[:19]})"
