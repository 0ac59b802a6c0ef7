"""The context of a node's page and an artifact's page (``console/site.py`` routes them by name)."""

from __future__ import annotations

from django.core.paginator import Paginator

from gpustack_models.console import queries
from gpustack_models.models import Prefetch, Resolution

PER_PAGE = 50


def watermarks(store) -> dict:
    spec = (store.body or {}).get("spec") or {}
    marks = spec.get("watermarks") or {}
    return {"high": marks.get("highPercent", 80), "low": marks.get("lowPercent", 70)}


def node_store(request, store) -> dict:
    entries = queries.with_percent(queries.with_placement(store.entries.all())).order_by("state", "digest")
    page = Paginator(entries, PER_PAGE).get_page(request.GET.get("p"))
    wanted = queries.wanted_by(e.digest for e in page)
    for entry in page:
        entry.wanted = wanted.get(entry.digest, [])
    used = store.used_percent  # the volume's, as the watermarks and CapacityLow read it
    return {
        "title": f"Node {store.name}",
        "store": store,
        "marks": watermarks(store),
        "used": min(100, used),
        "entries": page,
    }


def conditions(artifact) -> list[dict]:
    status = (artifact.body or {}).get("status") or {}
    return [c for c in status.get("conditions") or [] if isinstance(c, dict)]


def artifact_page(request, artifact) -> dict:
    resolution = Resolution.objects.select_related("manifest").filter(artifact=artifact).first()
    files = resolution.manifest.files if resolution else []
    prefetches = Prefetch.objects.live().filter(namespace=artifact.namespace, artifact_name=artifact.name)
    prefetches = Paginator(prefetches.order_by("name"), PER_PAGE).get_page(request.GET.get("pp"))
    for prefetch in prefetches:
        prefetch.lapse = queries.lapses(prefetch)
    entries = queries.with_percent(queries.claimed_entries([artifact.digest or "-"]))
    numbers = queries.progress([artifact.digest]).get(artifact.digest)
    target = f"mart {artifact.name} -n {artifact.namespace}"
    return {
        "title": f"Artifact {artifact}",
        "artifact": artifact,
        "resolution": resolution,
        "files": Paginator(files, PER_PAGE).get_page(request.GET.get("fp")),
        "prefetches": prefetches,
        "entries": Paginator(entries.order_by("state", "node"), PER_PAGE).get_page(request.GET.get("p")),
        "numbers": numbers,
        "bar": queries.bar_percent(numbers),
        "conditions": conditions(artifact),
        "kubectl": [f"kubectl get {target}", f"kubectl get {target} --subresource=progress"],
    }
