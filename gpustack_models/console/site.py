"""The console's admin site: a dashboard for its index, and the pages a person links by name: the tenants
(``tenants/<namespace>/``), an artifact (``artifacts/<namespace>/<name>/``), the node stores (``nodes/``) and
a node (``nodes/<name>/``). The stock pages of artifacts and node stores by row number redirect to these."""

from __future__ import annotations

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path

from gpustack_models.console import pages, queries
from gpustack_models.models import Artifact, NodeStore

PER_PAGE = 50
TENANT_SORTS = ("namespace", "artifacts", "wanted_bytes", "ready_nodes", "downloading_nodes", "failed_nodes")
ARTIFACT_SORTS = ("name", "resolved_status", "size_bytes", "repository")
NODE_SORTS = ("name", "used_percent", "entry_count", "ready", "downloading", "failed", "updated_at")


def sorted_by(rows, request, allowed, default):
    """``rows`` ordered by the ``o`` parameter when it names an allowed column (``-`` for descending)."""
    order = request.GET.get("o", default)
    if order.lstrip("-") not in allowed:
        order = default
    return rows.order_by(order, default.lstrip("-")), order


def sorted_rows(rows: list[dict], request, allowed, default):
    """Rows computed in Python ordered like ``sorted_by`` orders a query (ties by the default column)."""
    order = request.GET.get("o", default)
    if order.lstrip("-") not in allowed:
        order = default
    tie, key = default.lstrip("-"), order.lstrip("-")
    rows = sorted(rows, key=lambda row: row[tie])
    rows.sort(key=lambda row: row[key], reverse=order.startswith("-"))  # stable: ties keep the default order
    return rows, order


def page_of(rows, request):
    return Paginator(rows, PER_PAGE).get_page(request.GET.get("p"))


class ConsoleSite(admin.AdminSite):
    site_header = site_title = "GPUStack models"
    index_title = "Dashboard"
    enable_nav_sidebar = False
    site_url = None  # the console is the site: no "view site" link to a page that does not exist

    def get_urls(self):
        return [
            path("tenants/", self.admin_view(self.tenants_view), name="tenants"),
            path("tenants/<str:namespace>/", self.admin_view(self.tenant_view), name="tenant"),
            path("artifacts/<str:namespace>/<str:name>/", self.admin_view(self.artifact_view), name="artifact"),
            path("nodes/", self.admin_view(self.nodes_view), name="nodes"),
            path("nodes/<str:name>/", self.admin_view(self.node_view), name="node"),
            *super().get_urls(),
        ]

    def index(self, request, extra_context=None):
        context = {**self.each_context(request), "title": "Dashboard", **queries.dashboard()}
        request.current_app = self.name
        return TemplateResponse(request, "admin/index.html", context)

    def tenants_view(self, request):
        search = request.GET.get("q", "").strip()
        rows, order = sorted_rows(queries.tenants(search), request, TENANT_SORTS, "namespace")
        context = {
            **self.each_context(request),
            "title": "Tenants",
            "page": page_of(rows, request),
            "search": search,
            "order": order,
        }
        return TemplateResponse(request, "admin/console/tenants.html", context)

    def tenant_view(self, request, namespace):
        rows = Artifact.objects.live().filter(namespace=namespace)
        if not rows.exists():
            raise Http404("No artifacts in this namespace")
        search = request.GET.get("q", "").strip()
        if search:
            rows = rows.filter(Q(name__icontains=search) | Q(repository__icontains=search))
        rows, order = sorted_by(rows, request, ARTIFACT_SORTS, "name")
        page = page_of(rows, request)
        numbers = queries.progress(a.digest for a in page)
        lapsed = queries.lapsed_prefetches(namespace, (a.name for a in page))
        for artifact in page:
            artifact.numbers = numbers.get(artifact.digest)
            artifact.bar = queries.bar_percent(artifact.numbers)
            artifact.lapsed = lapsed.get(artifact.name, [])
        context = {
            **self.each_context(request),
            "title": f"Tenant {namespace}",
            "namespace": namespace,
            "page": page,
            "search": search,
            "order": order,
        }
        return TemplateResponse(request, "admin/console/tenant.html", context)

    def artifact_view(self, request, namespace, name):
        artifact = get_object_or_404(Artifact.objects.live(), namespace=namespace, name=name)
        context = {**self.each_context(request), **pages.artifact_page(request, artifact)}
        return TemplateResponse(request, "admin/console/artifact.html", context)

    def nodes_view(self, request):
        search = request.GET.get("q", "").strip()
        failed = request.GET.get("failed", "").strip()
        rows, order = sorted_by(queries.node_stores(search, failed), request, NODE_SORTS, "name")
        context = {
            **self.each_context(request),
            "title": "Nodes" + (f" with {failed} failures" if failed else ""),
            "page": page_of(rows, request),
            "search": search,
            "failed": failed,
            "order": order,
        }
        return TemplateResponse(request, "admin/console/nodes.html", context)

    def node_view(self, request, name):
        store = get_object_or_404(NodeStore.objects.live(), name=name)
        context = {**self.each_context(request), **pages.node_store(request, store)}
        return TemplateResponse(request, "admin/console/nodestore.html", context)
