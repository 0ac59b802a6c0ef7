"""The admin console's model pages: read-only views of the mirror (Kubernetes is the store of record).

The dashboard and the tenant pages are the console's site (``console/site.py``); the node store and
artifact pages take their numbers from ``console/pages.py``."""

from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.db.models import Count, Exists, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils.html import format_html

from gpustack_models.console import pages
from gpustack_models.kinds import FAILURE_REASONS
from gpustack_models.kinds.formatting import human_bytes
from gpustack_models.models import (
    Artifact,
    ConditionStatus,
    EntryState,
    InformerState,
    Manifest,
    Node,
    NodeStore,
    PluginPod,
    Prefetch,
    StoreEntry,
)

# Accounts are managed with manage.py (createsuperuser, changepassword), never through the console.
for account_model in (User, Group):
    if admin.site.is_registered(account_model):
        admin.site.unregister(account_model)


class FailureReasonFilter(admin.SimpleListFilter):
    """Rows with a Failed entry of this reason (a node store with one; an artifact whose digest has one)."""

    title = "failed entries"
    parameter_name = "failed"

    def lookups(self, request, model_admin):
        return [(r, r) for r in FAILURE_REASONS]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        failed = StoreEntry.objects.filter(state=EntryState.FAILED, reason=self.value())
        if queryset.model is NodeStore:
            return queryset.filter(Exists(failed.filter(store=OuterRef("pk"))))
        return queryset.filter(Exists(failed.filter(digest=OuterRef("digest"))))


class ReadOnlyAdmin(admin.ModelAdmin):
    """The system writes these rows; the console only shows them."""

    show_full_result_count = False
    list_per_page = 100
    actions = None

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        qs = super().get_queryset(request)
        return qs.filter(deleted=False) if hasattr(self.model, "deleted") else qs


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ("name", "namespace", "source_display", "state", "revision_short", "size", "nodes_display")
    list_filter = ("namespace", "source", "resolved_status", FailureReasonFilter)
    search_fields = ("name", "namespace", "repository", "digest")
    ordering = ("namespace", "name")
    readonly_fields = [f.name for f in Artifact._meta.fields]
    change_form_template = "admin/console/artifact.html"

    def render_change_form(self, request, context, *args, obj=None, **kwargs):
        context.update(pages.artifact_page(request, obj))
        return super().render_change_form(request, context, *args, obj=obj, **kwargs)

    @admin.display(description="source")
    def source_display(self, obj):
        return f"{obj.source}:{obj.repository}" if obj.source else ""

    @admin.display(description="state")
    def state(self, obj):
        if obj.resolved_status == ConditionStatus.TRUE:
            return format_html('<span class="state-ready">{}</span>', "Resolved")
        return format_html('<span class="state-pending">{}</span>', obj.resolved_reason or "Pending")

    @admin.display(description="revision")
    def revision_short(self, obj):
        return (obj.resolved_revision or obj.revision)[:12]

    @admin.display(description="size")
    def size(self, obj):
        return human_bytes(obj.size_bytes) if obj.size_bytes is not None else ""

    @admin.display(description="nodes (ready/downloading/failed)")
    def nodes_display(self, obj):
        n = obj.nodes or {}
        return f"{n.get('ready', 0)}/{n.get('downloading', 0)}/{n.get('failed', 0)}"


@admin.register(NodeStore)
class NodeStoreAdmin(ReadOnlyAdmin):
    list_display = ("name", "used", "used_percent", "models", "ready", "downloading", "failed")
    list_filter = (FailureReasonFilter,)
    search_fields = ("name",)
    ordering = ("name",)
    change_form_template = "admin/console/nodestore.html"

    def render_change_form(self, request, context, *args, obj=None, **kwargs):
        context.update(pages.node_store(request, obj))
        return super().render_change_form(request, context, *args, obj=obj, **kwargs)

    def get_queryset(self, request):
        """Entry counts in the list's one query, each a subquery by the store's key: the database counts the
        entries of the rows shown only, not of every store (unless the list is sorted by a count)."""

        def entries(state=None):
            rows = StoreEntry.objects.filter(store=OuterRef("pk"), **({"state": state} if state else {}))
            counted = rows.order_by().values("store").annotate(n=Count("pk")).values("n")
            return Coalesce(Subquery(counted), 0)

        return (
            super()
            .get_queryset(request)
            .annotate(
                model_count=entries(),
                ready_count=entries(EntryState.READY),
                downloading_count=entries(EntryState.DOWNLOADING),
                failed_count=entries(EntryState.FAILED),
            )
        )

    @admin.display(description="used", ordering="stored_bytes")
    def used(self, obj):
        return human_bytes(obj.stored_bytes)

    @admin.display(description="models", ordering="model_count")
    def models(self, obj):
        return obj.model_count

    @admin.display(description="ready", ordering="ready_count")
    def ready(self, obj):
        return obj.ready_count

    @admin.display(description="downloading", ordering="downloading_count")
    def downloading(self, obj):
        return obj.downloading_count

    @admin.display(description="failed", ordering="failed_count")
    def failed(self, obj):
        return obj.failed_count


@admin.register(Prefetch)
class PrefetchAdmin(ReadOnlyAdmin):
    list_display = ("name", "namespace", "artifact_name", "desired", "ready", "downloading", "available")
    list_filter = ("namespace",)
    search_fields = ("name", "namespace", "artifact_name")
    ordering = ("namespace", "name")
    readonly_fields = [f.name for f in Prefetch._meta.fields]

    @admin.display(description="desired")
    def desired(self, obj):
        return (obj.status or {}).get("desiredNodes", 0)

    @admin.display(description="ready")
    def ready(self, obj):
        return (obj.status or {}).get("readyNodes", 0)

    @admin.display(description="downloading")
    def downloading(self, obj):
        return (obj.status or {}).get("downloadingNodes", 0)

    @admin.display(description="available")
    def available(self, obj):
        for cond in (obj.status or {}).get("conditions") or []:
            if cond.get("type") == "Available":
                return cond.get("status")
        return "Unknown"


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ("name", "plugin_endpoint", "labels")
    search_fields = ("name",)
    readonly_fields = ("name", "labels", "resource_version")
    exclude = ("body", "uid", "deleted")

    def get_queryset(self, request):
        """The node's plugin Pod (a ready one first), by scalar subqueries on the Pods' node index: run for
        the rows shown only (an ``EXISTS`` may be planned as a hash of every Pod)."""
        pods = PluginPod.objects.live().filter(node=OuterRef("name")).order_by("-ready")
        return (
            super()
            .get_queryset(request)
            .annotate(plugin_ip=Subquery(pods.values("pod_ip")[:1]), plugin_ready=Subquery(pods.values("ready")[:1]))
        )

    @admin.display(description="plugin endpoint")
    def plugin_endpoint(self, obj):
        if obj.plugin_ready is None:
            return "no plugin"
        return f"{obj.plugin_ip} ({'ready' if obj.plugin_ready else 'not ready'})"


@admin.register(Manifest)
class ManifestAdmin(ReadOnlyAdmin):
    list_display = ("digest", "file_count", "size", "created_at")
    search_fields = ("digest",)
    readonly_fields = ("digest", "file_count", "size_bytes", "files", "created_at")

    @admin.display(description="size")
    def size(self, obj):
        return human_bytes(obj.size_bytes)


@admin.register(InformerState)
class InformerStateAdmin(ReadOnlyAdmin):
    list_display = ("resource", "resource_version", "relists", "expired", "updated_at")
