"""What the console's pages count, each in a fixed number of queries whatever the number of rows."""

from __future__ import annotations

from collections import defaultdict

from django.db import connection
from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    Exists,
    F,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, Least, NullIf

from gpustack_models.models import (
    Artifact,
    ConditionStatus,
    EntryState,
    Holding,
    Manifest,
    NodeStore,
    PluginPod,
    Prefetch,
    StoreEntry,
)

DOWNLOADING, READY, FAILED = EntryState.DOWNLOADING, EntryState.READY, EntryState.FAILED


def live_entries():
    """The entries of live stores: every entry (a store's tombstone takes its entries with it), as the
    nodes report them, for administrators."""
    return StoreEntry.objects.all()


def with_placement(entries):
    """Annotate entries with whether their digest was placed on their node (``placed``): a node reporting
    content it was never given is shown to administrators as such, and counted nowhere."""
    return entries.annotate(placed=Exists(Holding.objects.filter(node=OuterRef("node"), digest=OuterRef("digest"))))


def claimed_entries(digests):
    """The entries of ``digests`` that count in a tenant's numbers: those whose digest was placed on their
    node."""
    return StoreEntry.objects.claimed(digests).filter(digest__in=digests)


def percent_expression():
    """One downloading entry's percent as ``progress`` computes it: its bytes over its size (the manifest's
    size when the node reported none), capped at 100, truncated."""
    manifest_size = Subquery(Manifest.objects.filter(digest=OuterRef("digest")).values("size_bytes")[:1])
    size = Coalesce(NullIf(F("size_bytes"), Value(0)), manifest_size)
    share = Least(Value(100), F("downloaded_bytes") * 100 / NullIf(size, Value(0)), output_field=BigIntegerField())
    return Coalesce(share, Value(0), output_field=BigIntegerField())


def dashboard() -> dict:
    pods = PluginPod.objects.live().exclude(node="")
    plugins = pods.aggregate(
        nodes=Count("node", distinct=True), ready=Count("node", distinct=True, filter=Q(ready=True))
    )
    plugins["not_ready"] = plugins["nodes"] - plugins["ready"]
    capacity = cluster_capacity()
    artifacts = Artifact.objects.live().aggregate(
        total=Count("id"),
        resolved=Count("id", filter=Q(resolved_status=ConditionStatus.TRUE)),
        failed=Count("id", filter=Q(resolved_status=ConditionStatus.FALSE)),
    )
    artifacts["pending"] = artifacts["total"] - artifacts["resolved"] - artifacts["failed"]
    unresolved = (
        Artifact.objects.live()
        .filter(resolved_status=ConditionStatus.FALSE)
        .values("resolved_reason")
        .annotate(count=Count("id"))
        .order_by("-count", "resolved_reason")
    )
    return {
        "plugins": plugins,
        "capacity": capacity,
        "artifacts": artifacts,
        "unresolved": list(unresolved[:50]),
        "downloads": in_flight(),
        "failures": list(entry_failures()[:50]),
    }


def cluster_capacity() -> dict:
    """The stores' capacity figure summed: their volumes' bytes, their caches' bytes, and the volumes' used
    percent weighted by their size (each store's ``usedPercent``, what its watermarks use)."""
    sums = NodeStore.objects.live().aggregate(
        stores=Count("id"),
        total=Coalesce(Sum("total_bytes"), 0),
        stored=Coalesce(Sum("stored_bytes"), 0),
        weighted=Coalesce(Sum(F("used_percent") * F("total_bytes"), output_field=BigIntegerField()), 0),
    )
    total = sums["total"]
    return {
        "stores": sums["stores"],
        "total_bytes": total,
        "stored_bytes": sums["stored"],
        "used_percent": min(100, int(sums["weighted"] / total)) if total else 0,
    }


def node_stores(search: str = "", failed: str = ""):
    """The live stores (named like ``search``; with a Failed entry of reason ``failed``) with their entries
    counted by state, each count a subquery by the store's key: the database counts the entries of the rows
    shown only, not of every store (unless the list is sorted by a count)."""

    def entries(state=None):
        rows = StoreEntry.objects.filter(store=OuterRef("pk"), **({"state": state} if state else {}))
        counted = rows.order_by().values("store").annotate(n=Count("pk")).values("n")
        return Coalesce(Subquery(counted), 0)

    rows = NodeStore.objects.live()
    if search:
        rows = rows.filter(name__icontains=search)
    if failed:
        rows = rows.filter(Exists(StoreEntry.objects.filter(store=OuterRef("pk"), state=FAILED, reason=failed)))
    return rows.annotate(
        entry_count=entries(), ready=entries(READY), downloading=entries(DOWNLOADING), failed=entries(FAILED)
    )


def in_flight() -> dict:
    flying = live_entries().filter(state=DOWNLOADING)
    out = flying.aggregate(
        entries=Count("id"),
        nodes=Count("node", distinct=True),
        digests=Count("digest", distinct=True),
        done=Coalesce(Sum("downloaded_bytes"), 0),
        size=Coalesce(Sum("size_bytes"), 0),
    )
    out["percent"] = min(100, int(out["done"] * 100 / out["size"])) if out["size"] else 0
    return out


def entry_failures():
    """Failed entries by reason: how many entries, nodes and digests each reason has."""
    return (
        live_entries()
        .filter(state=FAILED)
        .values("reason")
        .annotate(entries=Count("id"), nodes=Count("node", distinct=True), digests=Count("digest", distinct=True))
        .order_by("-entries", "reason")
    )


_NODES_BY_NAMESPACE = """
    SELECT a.namespace, e.state, COUNT(DISTINCT e.node)
    FROM {entry} e
    JOIN {holding} h ON h.node = e.node AND h.digest = e.digest
    JOIN {artifact} a ON a.digest = e.digest AND NOT a.deleted
    WHERE LOWER(a.namespace) LIKE %s ESCAPE '!'
    GROUP BY a.namespace, e.state
"""
_NODE_KEYS = {READY: "ready_nodes", DOWNLOADING: "downloading_nodes", FAILED: "failed_nodes"}


def nodes_by_namespace(search: str = "") -> list[tuple[str, str, int]]:
    """(namespace, state, distinct nodes) over every namespace matching ``search``: one pass over the claimed
    entries joined to the artifacts by digest (joins on columns that are not foreign keys, hence written out)."""
    tables = {"entry": StoreEntry, "holding": Holding, "artifact": Artifact}
    sql = _NODES_BY_NAMESPACE.format(**{key: model._meta.db_table for key, model in tables.items()})
    escaped = search.lower().replace("!", "!!").replace("%", "!%").replace("_", "!_")
    pattern = f"%{escaped}%"
    with connection.cursor() as cursor:
        cursor.execute(sql, [pattern])
        return cursor.fetchall()


def tenants(search: str = "") -> list[dict]:
    """One row per namespace with artifacts: how many, the bytes they want, and their nodes by state (two
    queries whatever the number of namespaces, artifacts or entries)."""
    rows = Artifact.objects.live()
    if search:
        rows = rows.filter(namespace__icontains=search)
    counted = (
        rows.values("namespace")
        .annotate(
            artifacts=Count("id"),
            resolved=Count("id", filter=Q(resolved_status=ConditionStatus.TRUE)),
            wanted_bytes=Coalesce(Sum("size_bytes"), 0),
        )
        .order_by("namespace")
    )
    out = {row["namespace"]: dict(row, ready_nodes=0, downloading_nodes=0, failed_nodes=0) for row in counted}
    for namespace, state, count in nodes_by_namespace(search):
        if namespace in out and state in _NODE_KEYS:
            out[namespace][_NODE_KEYS[state]] = count
    return list(out.values())


def progress(digests) -> dict[str, dict]:
    """digest -> the numbers ``progress`` gives from the mirror's claimed entries (live bytes from the plugins
    aside): ready, downloading, failed, downloadingBytes, downloadingPercent, failureReasons."""
    digests = [d for d in set(digests) if d]
    if not digests:
        return {}
    entries = claimed_entries(digests).order_by()
    counted = entries.values("digest").annotate(
        ready=Count("id", filter=Q(state=READY)),
        downloading=Count("id", filter=Q(state=DOWNLOADING)),
        failed=Count("id", filter=Q(state=FAILED)),
        downloading_bytes=Coalesce(Sum("downloaded_bytes", filter=Q(state=DOWNLOADING)), 0),
        percent_sum=Coalesce(Sum(percent_expression(), filter=Q(state=DOWNLOADING)), 0),
    )
    out = {row["digest"]: dict(row, reasons=[]) for row in counted}
    for row in out.values():
        n = row["downloading"]
        row["percent"] = int(row.pop("percent_sum") / n) if n else None
    reasons = (
        entries.filter(state=FAILED)
        .values("digest")
        .annotate(reason=Coalesce(NullIf(F("reason"), Value("")), Value("Unknown")), count=Count("id"))
    )
    for row in reasons.order_by("digest", "reason"):
        out[row["digest"]]["reasons"].append({"reason": row["reason"], "count": row["count"]})
    return out


def bar_percent(numbers: dict | None) -> int:
    """Where an artifact's bar stands: 100 when every node holding it is ready, else the downloading
    nodes' average; 0 with no node."""
    if not numbers:
        return 0
    if numbers["downloading"]:
        return numbers["percent"] or 0
    return 100 if numbers["ready"] else 0


def wanted_by(digests) -> dict[str, list]:
    """digest -> the live artifacts (namespace, name) resolved to it."""
    out = defaultdict(list)
    rows = Artifact.objects.live().filter(digest__in=[d for d in digests if d]).order_by("namespace", "name")
    for digest, namespace, name in rows.values_list("digest", "namespace", "name"):
        out[digest].append({"namespace": namespace, "name": name})
    return out


def lapses(prefetch) -> dict | None:
    """A prefetch whose retention ran out on some of its nodes: how many, and its Available condition's
    reason and message (which say how to place it again); None for one that did not lapse."""
    status = prefetch.status or {}
    if not status.get("lapsedNodes"):
        return None
    available = next((c for c in status.get("conditions") or [] if c.get("type") == "Available"), {})
    return {
        "nodes": status["lapsedNodes"],
        "reason": available.get("reason", ""),
        "message": available.get("message", ""),
    }


def lapsed_prefetches(namespace: str, artifact_names) -> dict[str, list]:
    """artifact name -> its namespace's prefetches that lapsed somewhere, each with ``lapse`` (one query)."""
    out = defaultdict(list)
    rows = Prefetch.objects.live().filter(namespace=namespace, artifact_name__in=list(artifact_names))
    for prefetch in rows.filter(status__lapsedNodes__gt=0).order_by("name"):
        prefetch.lapse = lapses(prefetch)
        out[prefetch.artifact_name].append(prefetch)
    return out


def with_percent(entries):
    """Annotate entries with their download percent (0-100)."""
    pct = Least(Value(100), F("downloaded_bytes") * 100 / NullIf(F("size_bytes"), Value(0)))
    return entries.annotate(
        percent=Case(When(state=READY, then=Value(100)), default=Greatest(Coalesce(pct, Value(0)), Value(0)))
    )
