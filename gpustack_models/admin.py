"""The admin console: read-only views of the mirror (Kubernetes is the store of record)."""

from django.contrib import admin
from django.utils.html import format_html

from .kinds.formatting import human_bytes
from .models import Artifact, InformerState, Manifest, Node, NodeStore, PluginPod, Prefetch, StoreEntry


class ReadOnlyAdmin(admin.ModelAdmin):
    """The system writes these rows; the console only shows them."""

    show_full_result_count = False
    list_per_page = 100

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
    list_filter = ("namespace", "source", "resolved_status")
    search_fields = ("name", "namespace", "repository", "digest")
    ordering = ("namespace", "name")
    readonly_fields = [f.name for f in Artifact._meta.fields]

    @admin.display(description="source")
    def source_display(self, obj):
        return f"{obj.source}:{obj.repository}" if obj.source else ""

    @admin.display(description="state")
    def state(self, obj):
        if obj.resolved_status == "True":
            return format_html('<span class="state-ready">Resolved</span>')
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


class StoreEntryInline(admin.TabularInline):
    model = StoreEntry
    fields = ("digest", "state", "progress", "size", "reason", "retry_time")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="progress")
    def progress(self, obj):
        if obj.state == "Ready" or not obj.size_bytes:
            return "100%" if obj.state == "Ready" else ""
        return f"{int(obj.downloaded_bytes * 100 / obj.size_bytes)}%"

    @admin.display(description="size")
    def size(self, obj):
        return human_bytes(obj.size_bytes)


@admin.register(NodeStore)
class NodeStoreAdmin(ReadOnlyAdmin):
    list_display = ("name", "used", "used_percent", "models", "ready", "downloading", "failed")
    search_fields = ("name",)
    ordering = ("name",)
    inlines = [StoreEntryInline]
    readonly_fields = ("name", "resource_version", "spec_models", "total_bytes", "stored_bytes", "used_percent")
    exclude = ("body", "uid", "deleted")

    def _count(self, obj, state=None):
        entries = obj.entries.all()
        return sum(1 for e in entries if state is None or e.state == state)

    @admin.display(description="used")
    def used(self, obj):
        return human_bytes(obj.stored_bytes)

    @admin.display(description="models")
    def models(self, obj):
        return self._count(obj)

    @admin.display(description="ready")
    def ready(self, obj):
        return self._count(obj, "Ready")

    @admin.display(description="downloading")
    def downloading(self, obj):
        return self._count(obj, "Downloading")

    @admin.display(description="failed")
    def failed(self, obj):
        return self._count(obj, "Failed")

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("entries")


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

    @admin.display(description="plugin endpoint")
    def plugin_endpoint(self, obj):
        pod = PluginPod.objects.live().filter(node=obj.name).first()
        return f"{pod.pod_ip} ({'ready' if pod.ready else 'not ready'})" if pod else "no plugin"


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
