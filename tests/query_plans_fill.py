"""A mirror at cluster size for the query-plan checks, written with a few ``INSERT ... SELECT`` over
``generate_series`` (seconds for hundreds of thousands of rows, where the ORM would take minutes).

``fill(nodes)`` writes, for ``nodes`` nodes: a Node, a NodeStore and a plugin Pod each (1 in 500 a
tombstone), five store entries per node (50,000 at 10,000 nodes), one holding per entry, artifacts as many
as nodes in 100 namespaces over ``nodes // 5`` digests (five artifacts share each content) with their
manifests and resolutions, a prefetch per ten artifacts targeting 20 nodes each, mount references, failed
resolutions, Event series and budgets. One digest, ``HOT``, is held by a fifth of the nodes (the progress
benchmark's shape). Every value is spread the way a cluster spreads it: most entries Ready, some
Downloading or Failed, last uses over three days, a few graces running."""

from __future__ import annotations

from django.db import connection

from gpustack_models import models

HOT = "sha256:" + "f" * 64
DIGEST = "'sha256:5c' || lpad(to_hex({}), 62, '0')"  # the SQL of a digest numbered by an expression


def node_name(i: int) -> str:
    return f"sq-node-{i:05d}"


def digest(i: int) -> str:
    return "sha256:5c" + format(i, "x").rjust(62, "0")


def _t(model) -> str:
    return model._meta.db_table


def _mirrored(prefix: str) -> str:
    """The Mirrored columns: resourceVersion, uid, a tombstone in 500, a body, updated an hour ago or now."""
    return (
        f"1000 + i, '{prefix}-' || i, i % 500 = 499, '{{}}'::jsonb, "
        "CASE WHEN i % 500 = 499 THEN now() - interval '1 hour' ELSE now() END"
    )


def _nodes(n: int) -> list[str]:
    name = "'sq-node-' || lpad(i::text, 5, '0')"
    series = f"generate_series(0, {n - 1}) i"
    return [
        f"""INSERT INTO {_t(models.Node)} (resource_version, uid, deleted, body, updated_at, name, labels)
        SELECT {_mirrored("n")}, {name}, jsonb_build_object('zone', 'z' || (i % 10), 'gpu', 'g' || (i % 3))
        FROM {series}""",
        f"""INSERT INTO {_t(models.NodeStore)} (resource_version, uid, deleted, body, updated_at, name,
            spec_models, total_bytes, stored_bytes, used_percent)
        SELECT {_mirrored("s")}, {name}, '[]'::jsonb, 10^13, 4 * 10^12, 40 FROM {series}""",
        f"""INSERT INTO {_t(models.PluginPod)} (resource_version, uid, deleted, body, updated_at, namespace, name,
            node, pod_ip, ready)
        SELECT {_mirrored("p")}, 'gpustack-system', 'plugin-' || i, {name},
            '10.' || (i / 65536) || '.' || (i / 256 % 256) || '.' || (i % 256), i % 50 <> 7
        FROM {series}""",
    ]


def _entries(n: int) -> list[str]:
    digests = max(n // 5, 1)
    hot_nodes = n // 5
    number = f"(s.n * 7 + k * 13) % {digests}"
    state = "CASE WHEN (s.n + k) % 20 = 3 THEN 'Downloading' WHEN (s.n + k) % 50 = 11 THEN 'Failed' ELSE 'Ready' END"
    return [
        f"""INSERT INTO {_t(models.StoreEntry)} (store_id, node, digest, state, size_bytes, downloaded_bytes, reason,
            message, retry_time, last_used_time, source, pinned, collect_time)
        SELECT s.id, s.name,
            CASE WHEN k = 0 AND s.n < {hot_nodes} THEN '{HOT}' ELSE {DIGEST.format(number)} END,
            {state}, 5 * 10^9, ((s.n * 31 + k) % 100) * 5 * 10^7,
            CASE WHEN (s.n + k) % 50 = 11 THEN 'SourceUnavailable' ELSE '' END, '', NULL,
            now() - ((s.n * 13 + k * 7) % 72) * interval '1 hour', 'hub', false, NULL
        FROM (SELECT id, name, row_number() OVER (ORDER BY name) - 1 AS n
              FROM {_t(models.NodeStore)} WHERE name LIKE 'sq-node-%') s
        CROSS JOIN generate_series(0, 4) k""",
        f"""INSERT INTO {_t(models.Holding)} (node, digest, pinned, collect_time, added_at)
        SELECT node, digest, false,
            CASE WHEN id % 40 = 0 THEN now() + interval '5 minutes' ELSE NULL END, now()
        FROM {_t(models.StoreEntry)} WHERE node LIKE 'sq-node-%'""",
    ]


def _artifacts(n: int) -> list[str]:
    digests = max(n // 5, 1)
    namespace = "'sq-ns-' || lpad((i % 100)::text, 3, '0')"
    name = "'art-' || (i / 100)"
    finalizers = (
        "CASE WHEN i % 200 = 0 THEN jsonb_build_object('metadata', jsonb_build_object('finalizers', "
        f"jsonb_build_array('{models.MOUNT_PROTECTION}'))) ELSE '{{}}'::jsonb END"
    )
    return [
        f"""INSERT INTO {_t(models.Manifest)} (digest, files, file_count, size_bytes, created_at)
        SELECT {DIGEST.format("i")}, '[]'::jsonb, 5, 5 * 10^9, now() FROM generate_series(0, {digests - 1}) i""",
        f"""INSERT INTO {_t(models.Artifact)} (resource_version, uid, deleted, body, updated_at, namespace, name,
            generation, source, repository, revision, digest, resolved_revision, size_bytes, file_count,
            resolved_status, resolved_reason, nodes)
        SELECT 1000 + i, 'a-' || i, i % 500 = 499, {finalizers},
            CASE WHEN i % 500 = 499 THEN now() - interval '1 hour' ELSE now() END, {namespace}, {name}, 1,
            'huggingFace', 'org/model-' || i, 'main', {DIGEST.format(f"i % {digests}")}, 'c0ffee', 5 * 10^9, 5,
            CASE WHEN i % 50 = 5 THEN 'False' ELSE 'True' END,
            CASE WHEN i % 50 = 5 THEN 'AccessDenied' ELSE 'Resolved' END, '{{}}'::jsonb
        FROM generate_series(0, {n - 1}) i""",
        f"""INSERT INTO {_t(models.Resolution)} (artifact_id, artifact_uid, generation, manifest_id, source, endpoint,
            repository, commit, secret_name, resolved_at)
        SELECT id, uid, 1, digest, 'huggingFace', 'https://huggingface.co', repository, 'c0ffee', '', now()
        FROM {_t(models.Artifact)} WHERE resolved_status = 'True' AND namespace LIKE 'sq-ns-%'""",
        f"""INSERT INTO {_t(models.Namespace)} (resource_version, uid, deleted, body, updated_at, name,
            prefetch_bytes_per_node)
        SELECT {_mirrored("ns")}, 'sq-ns-' || lpad(i::text, 3, '0'), NULL FROM generate_series(0, 99) i""",
    ]


def _prefetches(n: int) -> list[str]:
    prefetches = max(n // 10, 1)
    selector = 'CASE WHEN i % 100 = 0 THEN \'{"matchLabels": {"zone": "z1"}}\'::jsonb ELSE NULL END'
    return [
        f"""INSERT INTO {_t(models.Prefetch)} (resource_version, uid, deleted, body, updated_at, namespace, name,
            artifact_name, node_names, node_selector, pinned, ttl_seconds, min_ready, created_at, status)
        SELECT {_mirrored("pf")}, 'sq-ns-' || lpad((i % 100)::text, 3, '0'), 'pf-' || (i / 100), 'art-' || (i / 100),
            '[]'::jsonb, {selector}, i % 7 = 0, CASE WHEN i % 3 = 0 THEN NULL ELSE 86400 END, 0, now(), '{{}}'::jsonb
        FROM generate_series(0, {prefetches - 1}) i""",
        f"""INSERT INTO {_t(models.PrefetchTarget)} (prefetch_id, node, state, lapsed_at, generation)
        SELECT p.id, 'sq-node-' || lpad(((p.id * 37 + j * 101) % {n})::text, 5, '0'),
            CASE WHEN j % 10 = 9 THEN 'NodeFull' ELSE 'Held' END, NULL, 1
        FROM {_t(models.Prefetch)} p CROSS JOIN generate_series(0, 19) j WHERE p.namespace LIKE 'sq-ns-%'""",
    ]


def _others(n: int) -> list[str]:
    mounts, failures = max(n // 5, 1), max(n // 20, 1)
    return [
        f"""INSERT INTO {_t(models.MountReference)} (node, volume_id, pod_namespace, pod_name, pod_uid, artifact,
            digest, size_bytes, created_at, last_seen)
        SELECT 'sq-node-' || lpad((i * 3 % {n})::text, 5, '0'), 'csi-' || i, 'sq-ns-' || lpad((i % 100)::text, 3, '0'),
            'pod-' || i, 'uid-' || i, 'art-' || (i / 100 % 100), {DIGEST.format(f"i % {max(n // 5, 1)}")}, 5 * 10^9,
            now(), now()
        FROM generate_series(0, {mounts - 1}) i""",
        f"""INSERT INTO {_t(models.ResolveState)} (namespace, name, uid, failed_reason, failures, retry_at,
            secret_name, secret_version, secret_checked_at, requested_at)
        SELECT 'sq-ns-' || lpad((i % 100)::text, 3, '0'), 'art-f' || i, 'u' || i, 'AccessDenied', 1,
            now() + ((i % 60) - 5) * interval '1 minute', CASE WHEN i % 2 = 0 THEN 'hub-token' ELSE '' END, '',
            now() - (i % 30) * interval '1 minute', ''
        FROM generate_series(0, {failures - 1}) i""",
        f"""INSERT INTO {_t(models.EventSeries)} (object_uid, type, reason, series_key, event_namespace, event_name,
            count, first_seen, last_seen)
        SELECT 'sq-obj-' || i, 'Normal', 'DownloadReady', '', 'default', 'ev-' || i, 1,
            now() - (i % 30) * interval '1 minute', now() - (i % 30) * interval '1 minute'
        FROM generate_series(0, {n - 1}) i""",
        f"""INSERT INTO {_t(models.EventBudget)} (object_uid, tokens, refilled_at, suppressed)
        SELECT 'sq-obj-' || i, 20, now() - (i % 30) * interval '1 minute', 0 FROM generate_series(0, {n - 1}) i""",
    ]


def fill(nodes: int) -> None:
    """Write the rows (see the module's docstring), then ``ANALYZE`` so the planner knows their sizes."""
    with connection.cursor() as cursor:
        for statement in _nodes(nodes) + _entries(nodes) + _artifacts(nodes) + _prefetches(nodes) + _others(nodes):
            cursor.execute(statement)
        cursor.execute("ANALYZE")
