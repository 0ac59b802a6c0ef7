"""The admin console's model pages: read-only views of the mirror (Kubernetes is the store of record).

The dashboard, the tenant pages, an artifact's page, the node stores' list and a node's page are the
console's site (``console/site.py``), each linked by name; the stock pages of an artifact or a node store
by row number, and the stock list of node stores, redirect there. Times print as the console prints them
(``config/formats``)."""

from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.db.models import Exists, OuterRef, Subquery
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.html import format_html

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
    """Artifacts whose digest has a Failed entry of this reason (the node stores' list has its own: ``failed``)."""

    title = "failed entries"
    parameter_name = "failed"

    def lookups(self, request, model_admin):
        return [(r, r) for r in FAILURE_REASONS]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        failed = StoreEntry.objects.filter(state=EntryState.FAILED, reason=self.value())
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


def artifact_link(namespace: str, name: str, text: str | None = None) -> str:
    return format_html('<a href="{}">{}</a>', reverse("admin:artifact", args=[namespace, name]), text or name)


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ("name_link", "namespace", "source_display", "state", "revision_short", "size", "nodes_display")
    list_display_links = None
    list_filter = ("namespace", "source", "resolved_status", FailureReasonFilter)
    search_fields = ("name", "namespace", "repository", "digest")
    ordering = ("namespace", "name")

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The artifact's page is linked by namespace and name: the row number's URL redirects there."""
        artifact = get_object_or_404(self.get_queryset(request), pk=object_id)
        return redirect("admin:artifact", artifact.namespace, artifact.name, permanent=True)

    @admin.display(description="name", ordering="name")
    def name_link(self, obj):
        return artifact_link(obj.namespace, obj.name)

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
    """Node stores are listed and shown by the console's site (``nodes/``, ``nodes/<name>/``): the stock
    list (with its search and failure filter) and a store's page by row number redirect there."""

    def changelist_view(self, request, extra_context=None):
        params = request.GET.urlencode()
        return redirect(reverse("admin:nodes") + (f"?{params}" if params else ""))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        store = get_object_or_404(self.get_queryset(request), pk=object_id)
        return redirect("admin:node", store.name, permanent=True)


@admin.register(Prefetch)
class PrefetchAdmin(ReadOnlyAdmin):
    list_display = ("name", "namespace", "artifact", "desired", "ready", "downloading", "lapsed", "available")
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

    @admin.display(description="artifact", ordering="artifact_name")
    def artifact(self, obj):
        return artifact_link(obj.namespace, obj.artifact_name)

    @admin.display(description="lapsed")
    def lapsed(self, obj):
        return (obj.status or {}).get("lapsedNodes", 0)

    @admin.display(description="available")
    def available(self, obj):
        """The Available condition's status; when not True, its reason and message too (``Lapsed``: how to
        place the prefetch again)."""
        for cond in (obj.status or {}).get("conditions") or []:
            if cond.get("type") == "Available":
                if cond.get("status") == "True":
                    return "True"
                return f"{cond.get('status')} ({cond.get('reason')}): {cond.get('message')}"
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
