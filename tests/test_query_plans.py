"""The mirror's hot queries and writes at cluster size, checked with PostgreSQL's own planner.

The mirror is filled at 10,000 nodes, 50,000 store entries and 10,000 artifacts (``query_plans_fill``, plain
SQL, then ``ANALYZE``); each hot path (progress, roll-ups, a node's reconcile, the collection pass, the
prefetch status, the informers' conditional upserts, prunes and tombstone purges, the mount check, retries,
placement, fetch tickets, the console's pages) runs for real while the SQL it sends is captured, and each
statement is given to ``EXPLAIN (FORMAT JSON)``: none may read a big table with a sequential scan, except
the few that count or compare the whole cluster by design (each named below with why). A failure prints the
statement and its plan.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from gpustack_models import models
from tests.query_plans_fill import HOT, digest, fill, node_name

pytestmark = pytest.mark.django_db  # the test database (each test's own transaction nests in the module's)

NODES = 10_000  # 50,000 entries, 10,000 artifacts
BIG = {
    m._meta.db_table
    for m in (
        models.Node,
        models.NodeStore,
        models.PluginPod,
        models.StoreEntry,
        models.Holding,
        models.Artifact,
        models.Resolution,
        models.Prefetch,
        models.PrefetchTarget,
        models.MountReference,
    )
}  # Event series and budgets are bounded by time (each leaves when its window ends): not counted big
ARTIFACT, ENTRY, STORE, NODE, POD, HOLDING = (
    m._meta.db_table
    for m in (models.Artifact, models.StoreEntry, models.NodeStore, models.Node, models.PluginPod, models.Holding)
)


@dataclass(frozen=True)
class WholeCluster:
    """A statement that reads all of ``table`` by design (the SQL matching ``pattern``), and why."""

    table: str
    pattern: str
    why: str

    def allows(self, table: str, sql: str) -> bool:
        return table == self.table and re.search(self.pattern, sql, re.S) is not None


# The dashboard and the tenants page count every artifact, store and entry; the console's lists count their
# rows for the paginator; a relist compares every live row with what the list returned.
DASHBOARD = [
    WholeCluster(POD, r"COUNT\(DISTINCT", "the dashboard counts the nodes running the plugin"),
    WholeCluster(STORE, r"SUM\(", "the dashboard sums every store's capacity"),
    WholeCluster(ARTIFACT, r"COUNT\(", "the dashboard counts artifacts by resolution"),
]
TENANTS = [
    WholeCluster(ARTIFACT, r"GROUP BY", "the tenants page counts every namespace's artifacts"),
    WholeCluster(ENTRY, r"COUNT\(DISTINCT e\.node\)", "the tenants page counts every namespace's nodes"),
    WholeCluster(STORE, r"COUNT\(DISTINCT e\.node\)", "(joined with the entries above)"),
    WholeCluster(HOLDING, r"COUNT\(DISTINCT e\.node\)", "(the entries counted are those placed on their node)"),
]
PAGINATOR = r"^SELECT COUNT\(\*\)"
LISTS = [
    *(WholeCluster(table, PAGINATOR, "the paginator counts the list") for table in (ARTIFACT, STORE, NODE)),
    WholeCluster(ARTIFACT, r"^SELECT DISTINCT .*namespace", "the artifacts' filter lists every namespace"),
]
# The collection pass (once a minute) looks for retentions run out over every held target and Ready entry.
RETENTION = [
    WholeCluster(table, pattern, "the collection pass: every retention that can run out")
    for table, pattern in (
        (models.PrefetchTarget._meta.db_table, r"MIN\("),
        (models.Prefetch._meta.db_table, r"MIN\(|prefetch_ttl|ttl_seconds"),
        (ENTRY, r"last_used_time\" <"),
        (ARTIFACT, r"digest\" IN \("),
        (models.PrefetchTarget._meta.db_table, r"ttl_seconds"),
    )
]


def scans(plan: dict):
    """Every (node type, relation) of a plan tree."""
    yield plan.get("Node Type"), plan.get("Relation Name")
    for child in plan.get("Plans") or ():
        yield from scans(child)


def explain(sql: str) -> dict:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        value = cursor.fetchone()[0]
    return (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]


def sequential_scans(captured, allowed=()) -> list[str]:
    """Each captured statement that reads a big table sequentially (and is not allowed to), with its plan."""
    problems = []
    for query in captured:
        sql = query["sql"]
        if not re.match(r"\s*(SELECT|UPDATE|DELETE|INSERT|WITH)\b", sql, re.I):
            continue  # savepoints
        plan = explain(sql)
        bad = {
            table
            for kind, table in scans(plan)
            if kind in ("Seq Scan", "Parallel Seq Scan") and table in BIG
            if not any(rule.allows(table, sql) for rule in allowed)
        }
        if bad:
            problems.append(f"sequential scan of {sorted(bad)}:\n{sql}\n{json.dumps(plan, indent=1)[:6000]}")
    return problems


@pytest.fixture(scope="module")
def cluster_sized(django_db_setup, django_db_blocker):
    """The filled mirror for the module (one transaction, rolled back at the end)."""
    with django_db_blocker.unblock():
        atomic = transaction.atomic()
        atomic.__enter__()
        try:
            started = time.monotonic()
            fill(NODES)
            print(f"filled the mirror at {NODES} nodes in {time.monotonic() - started:.1f}s")
            yield
        finally:
            transaction.set_rollback(True)
            atomic.__exit__(None, None, None)


@pytest.fixture
def plans(cluster_sized, django_db_blocker):
    """Run a hot path under a savepoint (its writes undone after), checking every statement's plan."""

    def check(run, allowed=()):
        with django_db_blocker.unblock(), transaction.atomic():
            with CaptureQueriesContext(connection) as captured:
                run()
            problems = sequential_scans(captured.captured_queries, allowed)
            assert captured.captured_queries, "the hot path sent no statement"
            transaction.set_rollback(True)
        assert not problems, "\n\n".join(problems)

    return check


def test_progress(plans):
    from gpustack_models.api import progress

    def run():
        counts = progress.tally(HOT, 5 * 10**9)
        assert counts.ready + len(counts.downloading) + counts.failed > NODES // 5 * 0.99
        with override_settings(PROGRESS_DEADLINE=0.0):  # the plugins' endpoints are read, nobody is called
            assert progress.live_bytes(HOT, counts.downloading, time.monotonic()) == {}

    plans(run)


def filtered_nested_loops(captured) -> list[str]:
    """Each captured statement whose plan joins two big tables by a nested loop that compares every outer row
    with every inner one (a ``Join Filter``, no index lookup): quadratic in the rows of one digest."""
    problems = []
    for query in captured:
        plan = explain(query["sql"])
        for node in walk(plan):
            tables = {table for _, table in scans(node) if table in BIG}
            if node.get("Node Type") == "Nested Loop" and "Join Filter" in node and len(tables) > 1:
                problems.append(f"{node['Join Filter']} over {sorted(tables)}:\n{query['sql']}")
    return problems


def walk(plan: dict):
    yield plan
    for child in plan.get("Plans") or ():
        yield from walk(child)


def test_progress_of_a_digest_on_a_mirror_filled_since_its_statistics(cluster_sized, django_db_blocker):
    # A new cluster: PostgreSQL last analyzed the entries and holdings while they were empty, then 2,000 nodes
    # reported a digest (autovacuum analyzes within a minute or so). It estimates a row or two of each, and
    # joining a digest's entries to its holdings planned a nested loop comparing every entry with every
    # holding: 4 million comparisons, 336 ms for one answer of make bench's progress (2,000 nodes); 10,000
    # would pass progress's 13 s. progress reads the two apart.
    from gpustack_models.api import progress

    fresh = "sha256:" + "e" * 64
    with django_db_blocker.unblock(), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {HOLDING}")
            cursor.execute(f"DELETE FROM {ENTRY}")
            cursor.execute(f"ANALYZE {ENTRY}, {HOLDING}")  # rolled back with the rest at the test's end
            cursor.execute(
                f"""INSERT INTO {ENTRY} (store_id, node, digest, state, size_bytes, downloaded_bytes, reason, message,
                    source, pinned)
                SELECT id, name, %s, CASE WHEN id %% 10 = 0 THEN 'Downloading' ELSE 'Ready' END, 5 * 10^9, 10^9,
                    '', '', 'hub', false
                FROM {STORE} WHERE name LIKE 'sq-node-%%' ORDER BY name LIMIT 2000""",
                [fresh],
            )
            cursor.execute(
                f"""INSERT INTO {HOLDING} (node, digest, pinned, added_at)
                SELECT node, digest, false, now() FROM {ENTRY} WHERE digest = %s AND node < 'sq-node-01900'""",
                [fresh],
            )
        with CaptureQueriesContext(connection) as captured:
            counts = progress.tally(fresh, 5 * 10**9)
        problems = filtered_nested_loops(captured.captured_queries)
        transaction.set_rollback(True)
    assert counts.ready + len(counts.downloading) == 1900, counts  # the 100 entries without a holding: none
    assert not problems, "\n\n".join(problems)


def test_rollup_and_prefetch_status(plans):
    from gpustack_models.reconcilers import prefetches, rollup

    def run():
        assert sum(rollup.digest_counts(HOT).get(k, 0) for k in rollup.COUNTS) > NODES // 5 * 0.99
        rollup.failure_reasons(digest(17))
        list(models.Artifact.objects.live().filter(digest=digest(17)))
        assert prefetches.prefetches_of_digest(digest(17))
        prefetch = models.Prefetch.objects.live().get(namespace="sq-ns-017", name="pf-0")
        state = prefetches.PrefetchState.read(prefetch)
        assert state.desired == 20

    plans(run)


def test_node_reconcile(plans):
    from gpustack_models.reconcilers import node_stores, references

    def run():
        node, now = node_name(4242), timezone.now()
        refs, states = references.node_references(node, now)
        placement = references.place(refs, states, references.namespace_quotas(refs))
        node_stores.desired_models(node, placement, now)
        node_stores._record_states(placement.states)
        references.mount_references(node_name(3))

    plans(run)


def test_collection_pass(plans):
    from gpustack_models.reconcilers import collection

    plans(lambda: collection.collection_pass(timezone.now()), RETENTION)


def test_retargeting(plans):
    from gpustack_models.reconcilers import selection

    plans(lambda: selection.retarget_node(node_name(4242)))


def test_mirror_writes(plans):
    from gpustack_models.informers import mirror

    def run():
        store = {
            "metadata": {"name": node_name(4242), "resourceVersion": "99999999", "uid": "s-4242"},
            "status": {"models": [{"digest": HOT, "state": "Ready", "sizeBytes": 5}]},
        }
        assert mirror.apply_object(mirror.STORES, store).applied
        artifact = {"metadata": {"name": "art-3", "namespace": "sq-ns-042", "resourceVersion": "99999999"}, "spec": {}}
        assert mirror.apply_object(mirror.ARTIFACTS, artifact).applied
        assert not mirror.apply_object(
            mirror.ARTIFACTS, dict(artifact, metadata={**artifact["metadata"], "resourceVersion": "1"})
        ).applied
        node = {"metadata": {"name": node_name(77), "resourceVersion": "99999999"}}
        assert mirror.delete_object(mirror.NODES, node).applied
        assert mirror.purge_tombstones(timezone.now() - timedelta(minutes=10)) > 0

    plans(run)


def test_relist_prune(plans):
    """A relist compares every live row with what the list returned: a pass over the table by design;
    what it tombstones is written by key."""
    from gpustack_models.informers import mirror

    keys = [{"name": node_name(i)} for i in range(NODES) if i != 4242]
    rule = [WholeCluster(STORE, r"resource_version\" <= ", "a relist's prune compares every live row")]
    plans(lambda: mirror.prune(mirror.STORES, keys, 10**9), rule)


def test_periodic_passes(plans):
    from gpustack_models.reconcilers import events, mount_checks, retries

    def run():
        mount_checks.leftover_protections()
        retries.take_due(100)
        retries.unscheduled(100)
        retries.never_resolved(100)
        events.purge()

    plans(run)


def test_api_paths(plans):
    from gpustack_models.internal import tickets
    from gpustack_models.webhooks import placement

    def run():
        assert placement.holders("sq-ns-017", ["art-3", "art-4"])
        rows = tickets.resolutions(digest(17))
        assert rows
        tickets.wanting_namespaces(node_name(4242), digest(17), rows)
        tickets.peer_sources(node_name(4242), digest(17))

    plans(run)


@pytest.fixture
def console(cluster_sized, django_db_blocker):
    from django.contrib.auth.models import User

    with django_db_blocker.unblock(), transaction.atomic():
        user = User.objects.create(username="scale-admin", is_staff=True, is_superuser=True)
        client = Client()
        client.force_login(user)
        yield client
        transaction.set_rollback(True)


def _get(client, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)


def test_console_object_pages(plans, console):
    """A tenant, a node and an artifact: what they show is found by index, whatever the cluster's size."""
    store = models.NodeStore.objects.get(name=node_name(4242))
    artifact = models.Artifact.objects.get(namespace="sq-ns-017", name="art-3")
    plans(
        lambda: [
            _get(console, reverse("admin:tenant", args=["sq-ns-017"])),
            _get(console, reverse("admin:node", args=[store.name])),
            _get(console, reverse("admin:artifact", args=[artifact.namespace, artifact.name])),
        ]
    )


LIST_PAGES = ("admin:gpustack_models_artifact_changelist", "admin:nodes", "admin:gpustack_models_node_changelist")


def test_console_lists(plans, console):
    """The lists read one page each; only their row count (for the paginator) reads a table whole."""
    plans(
        lambda: [_get(console, reverse(name)) for name in LIST_PAGES],
        LISTS,
    )
    # Artifacts with a failure of a reason somewhere: the filter may match a large share of them (here about
    # a third), where reading the table is the planner's right choice.
    failing = WholeCluster(ARTIFACT, r"EXISTS\(SELECT 1 .*'Failed'", "a failure filter matching many artifacts")
    failed = "?failed=SourceUnavailable"
    plans(lambda: _get(console, reverse("admin:gpustack_models_artifact_changelist") + failed), [*LISTS, failing])


def test_console_dashboard_and_tenants(plans, console):
    """The dashboard and the tenants page count the whole cluster (one pass each); their lists of downloads
    in flight and of failures read only those entries."""
    plans(lambda: _get(console, reverse("admin:index")), DASHBOARD)
    plans(lambda: _get(console, reverse("admin:tenants")), TENANTS)
