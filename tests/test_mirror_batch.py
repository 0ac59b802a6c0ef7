"""Batched informer events: coalesced per object, applied in one task with the mirror's guards, reactions
once per batch and key, every event accounted for, nothing buffered lost on a clean stop."""

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpustack_models.informers.coalescing import BatchingSink, Coalescer
from gpustack_models.local.cluster import free_port
from gpustack_models.models import Artifact, InformerState, Namespace, NodeStore
from tests.support import wait_for
from tests.support.paths import REPO, TEST_STATE
from tests.support.worker import MIRROR_LAG_FILE
from tests.test_api_authz import make_namespace


def art(ns, name, rv, uid="u1", label="x"):
    return {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "ModelArtifact",
        "metadata": {"namespace": ns, "name": name, "resourceVersion": str(rv), "uid": uid, "labels": {"v": label}},
        "spec": {"source": {"huggingFace": {"repository": "batch/unknown"}}},
    }


def summary(entries):
    """(type, name, rv, events) of each entry a buffer sent."""
    return [(t, o["metadata"]["name"], int(o["metadata"]["resourceVersion"]), n) for t, o, _, n in entries]


# --- The buffer --------------------------------------------------------------------------------------------


def test_the_latest_state_of_each_object_wins_in_the_order_objects_came():
    buffer = Coalescer()
    for i, (type_, name, rv) in enumerate(
        [("ADDED", "a", 1), ("MODIFIED", "a", 2), ("ADDED", "b", 3), ("MODIFIED", "a", 4), ("MODIFIED", "b", 5)]
    ):
        buffer.add(type_, art("ns", name, rv), arrived=100.0 + i)
    assert buffer.size == 2
    entries = buffer.take()
    assert summary(entries) == [("MODIFIED", "a", 4, 3), ("MODIFIED", "b", 5, 2)]
    # Each entry's lag counts from its first event.
    assert [e[2] for e in entries] == [100.0, 102.0]
    assert buffer.take() == [] and buffer.size == 0


def test_a_delete_wins_over_earlier_states_and_a_recreation_follows_it():
    buffer = Coalescer()
    events = [
        ("ADDED", art("ns", "a", 1)),
        ("MODIFIED", art("ns", "a", 2)),
        ("DELETED", art("ns", "a", 3)),
        ("ADDED", art("ns", "a", 4, uid="u2")),
        ("MODIFIED", art("ns", "a", 5, uid="u2")),
        ("ADDED", art("other", "a", 6)),  # another namespace: another object
    ]
    for i, (type_, obj) in enumerate(events):
        buffer.add(type_, obj, arrived=float(i))
    assert summary(buffer.take()) == [("DELETED", "a", 3, 3), ("MODIFIED", "a", 5, 2), ("ADDED", "a", 6, 1)]
    # Deleted again: the latest delete replaces all of it.
    for i, (type_, obj) in enumerate(events[:4] + [("DELETED", art("ns", "a", 7, uid="u2"))]):
        buffer.add(type_, obj, arrived=float(i))
    assert summary(buffer.take()) == [("DELETED", "a", 7, 5)]


class Sent:
    """What a sink hands on, in order (the Celery dispatch is replaced: this checks the sink alone)."""

    def __init__(self):
        self.calls, self.lock = [], threading.Lock()

    def events(self, resource, entries):
        with self.lock:
            self.calls.append(("events", resource, summary(entries), time.monotonic()))

    def batch(self, resource, objects):
        self.calls.append(("batch", resource, len(objects), time.monotonic()))

    def prune(self, resource, keys, list_rv):
        self.calls.append(("prune", resource, list_rv, time.monotonic()))

    def record(self, resource, resource_version, expired):
        self.calls.append(("record", resource, resource_version, time.monotonic()))


def test_the_sink_sends_by_count_by_time_before_a_relist_and_on_close():
    sent = Sent()
    sink = BatchingSink(sent, seconds=0.3, size=3)
    try:
        for rv in range(1, 4):  # three objects: full
            sink.event("modelartifacts", "ADDED", art("ns", f"o{rv}", rv))
        assert [c[:3] for c in sent.calls] == [
            ("events", "modelartifacts", [("ADDED", f"o{i}", i, 1) for i in (1, 2, 3)])
        ]
        first = time.monotonic()
        sink.event("modelartifacts", "MODIFIED", art("ns", "o1", 4))
        sink.event("modelartifacts", "MODIFIED", art("ns", "o1", 5))
        wait_for(lambda: len(sent.calls) == 2, timeout=5, interval=0.01, message="the timed flush")
        assert sent.calls[1][2] == [("MODIFIED", "o1", 5, 2)]
        assert 0.25 <= sent.calls[1][3] - first < 2.0
        # A prune or a record never overtakes what is buffered.
        sink.event("modelartifacts", "MODIFIED", art("ns", "o2", 6))
        sink.prune("modelartifacts", [], 6)
        sink.event("modelartifacts", "DELETED", art("ns", "o3", 7))
        sink.record("modelartifacts", "7", False)
        sink.event("modelartifacts", "MODIFIED", art("ns", "o2", 8))
        sink.batch("modelartifacts", [art("ns", "o2", 8)])
        sink.event("modelartifacts", "MODIFIED", art("ns", "o2", 9))
        assert [c[0] for c in sent.calls[2:]] == ["events", "prune", "events", "record", "events", "batch"]
    finally:
        sink.close()
    assert sent.calls[-1][:3] == ("events", "modelartifacts", [("MODIFIED", "o2", 9, 1)])
    sink.event("modelartifacts", "MODIFIED", art("ns", "o2", 10))  # after close: sent on its own
    assert sent.calls[-1][2] == [("MODIFIED", "o2", 10, 1)]
    assert not sink.timer.is_alive()


def test_events_the_broker_refused_are_kept_and_sent_again():
    class Refusing(Sent):
        refusals = 1

        def __init__(self):
            super().__init__()
            self.refused, self.refusal = [], threading.Event()

        def events(self, resource, entries):
            if self.refusals:
                self.refusals -= 1
                self.refused.append(summary(entries))
                self.refusal.set()
                raise ConnectionError("broker away")
            super().events(resource, entries)

    sent = Refusing()
    sink = BatchingSink(sent, seconds=0.05, size=100)
    try:
        sink.event("modelartifacts", "ADDED", art("ns", "a", 1))
        assert sent.refusal.wait(5), "the timed flush"
        assert sent.refused == [[("ADDED", "a", 1, 1)]] and sent.calls == []  # sent alone, and refused
        # What arrives after the refusal joins the kept entries.
        sink.event("modelartifacts", "MODIFIED", art("ns", "a", 2))
        sink.event("modelartifacts", "ADDED", art("ns", "b", 3))
        wait_for(lambda: sent.calls, timeout=5, interval=0.05, message="the second try")
        assert sent.calls[0][2] == [("MODIFIED", "a", 2, 2), ("ADDED", "b", 3, 1)]
        # A flush the watch thread makes (a prune here) raises, so its watch reconnects; nothing is lost.
        sent.refusals = 1
        sink.event("modelartifacts", "MODIFIED", art("ns", "a", 4))
        with pytest.raises(ConnectionError):
            sink.prune("modelartifacts", [], 4)
        sink.prune("modelartifacts", [], 4)
        assert [c[:3] for c in sent.calls[1:]] == [("events", "modelartifacts", [("MODIFIED", "a", 4, 1)]),
                                                   ("prune", "modelartifacts", 4)]  # fmt: skip
    finally:
        sink.close()


# --- The task ----------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=False)
def test_a_batch_keeps_the_resource_version_guards_and_the_tombstones():
    from gpustack_models.reconcilers.tasks import mirror_events

    ns = f"batch-{uuid.uuid4().hex[:6]}"

    def entries(*events):
        return [[t, o, time.time(), 1] for t, o in events]

    mirror_events.run("modelartifacts", entries(("ADDED", art(ns, "x", 20, label="x20")),
                                                ("ADDED", art(ns, "gone", 25)),
                                                ("ADDED", art(ns, "kept", 12))))  # fmt: skip
    result = mirror_events.run(
        "modelartifacts",
        entries(
            ("MODIFIED", art(ns, "x", 15, label="stale")),  # older than the row: ignored
            ("ADDED", art(ns, "y", 30)),
            ("DELETED", art(ns, "gone", 31)),  # a tombstone at the deletion's version
            ("DELETED", art(ns, "kept", 10)),  # older than the row: ignored
            ("DELETED", art(ns, "again", 40)),  # deleted and created again within the batch
            ("ADDED", art(ns, "again", 41, uid="u2", label="new")),
        ),
    )
    assert result["applied"] == 3  # y, gone, the recreation ("again" had no row: its tombstone is no change)
    rows = {r.name: r for r in Artifact.objects.filter(namespace=ns)}
    assert (rows["x"].resource_version, rows["x"].body["metadata"]["labels"]) == (20, {"v": "x20"})
    assert (rows["gone"].deleted, rows["gone"].resource_version) == (True, 31)
    assert (rows["kept"].deleted, rows["kept"].resource_version) == (False, 12)
    assert (rows["again"].deleted, rows["again"].resource_version, rows["again"].uid) == (False, 41, "u2")
    assert rows["y"].resource_version == 30
    # The same batch delivered twice changes nothing the second time.
    again = entries(("DELETED", art(ns, "gone", 31)), ("ADDED", art(ns, "y", 30)))
    assert mirror_events.run("modelartifacts", again)["applied"] == 0


@pytest.mark.django_db(transaction=False)
def test_the_per_event_task_records_its_lag_too(settings, tmp_path):
    from gpustack_models.reconcilers.tasks import mirror_event

    ns, arrived = f"lag-{uuid.uuid4().hex[:6]}", time.time()
    settings.MIRROR_LAG_FILE = str(tmp_path / "lag.jsonl")
    assert mirror_event.run("modelartifacts", "ADDED", art(ns, "p", 5), arrived=arrived) is True
    # A stale event changes nothing and is still accounted for (its row already holds something newer).
    assert mirror_event.run("modelartifacts", "MODIFIED", art(ns, "p", 4), arrived=arrived) is False
    lines = [json.loads(line) for line in (tmp_path / "lag.jsonl").read_text().splitlines()]
    assert [(x["r"], x["k"], x["rv"], x["n"]) for x in lines] == [("modelartifacts", f"{ns}/p", "5", 1),
                                                                  ("modelartifacts", f"{ns}/p", "4", 1)]  # fmt: skip
    assert all(x["a"] == arrived and x["c"] >= arrived for x in lines)
    # A lag file that cannot be written never fails the mirror.
    settings.MIRROR_LAG_FILE = str(tmp_path / "missing" / "lag.jsonl")
    assert mirror_event.run("modelartifacts", "MODIFIED", art(ns, "p", 6), arrived=arrived) is True
    assert Artifact.objects.get(namespace=ns, name="p").resource_version == 6


def store(name, rv, digest, state, uid="s1"):
    return {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "NodeModelStore",
        "metadata": {"name": name, "resourceVersion": str(rv), "uid": uid},
        "spec": {"models": []},
        "status": {"models": [{"digest": digest, "state": state, "sizeBytes": 10, "downloadedBytes": 5}]},
    }


@pytest.mark.django_db(transaction=False)
def test_reactions_are_enqueued_once_per_key_per_batch():
    from gpustack_models.reconcilers.tasks import mirror_events

    prefix, digest = f"rb{uuid.uuid4().hex[:5]}", f"sha256:{uuid.uuid4().hex * 2}"
    names = [f"{prefix}-{i}" for i in range(5)]
    now = time.time()
    created = [["ADDED", store(n, 10, digest, "Downloading"), now, 1] for n in names]
    # One store deleted and created again in the same batch: two changes of the same node.
    changed = [["MODIFIED", store(n, 20, digest, "Ready"), now, 1] for n in names[:4]]
    changed += [["DELETED", store(names[4], 21, digest, "Ready"), now, 1],
                ["ADDED", store(names[4], 22, digest, "Downloading", uid="s2"), now, 1]]  # fmt: skip
    # The first batch creates five stores, the second changes their entries and deletes and creates one
    # again (two changes of that node, whose spec the recreation changes).
    for batch, reconciled in ((created, names), (changed, names[4:])):
        result = mirror_events.run("nodemodelstores", batch)
        assert result["applied"] == len(batch)
        by_task = {}
        for name, args, _ in result["enqueued"]:
            by_task.setdefault(name, []).append(args)
        # Five stores changed one digest's entries: one roll-up; each node reconciled once.
        assert by_task["gpustack_models.rollup_digest"] == [[digest]]
        assert sorted(by_task["gpustack_models.reconcile_node_store"]) == [[n] for n in reconciled]
    assert NodeStore.objects.live().filter(name__startswith=prefix).count() == 5
    assert NodeStore.objects.get(name=names[4]).uid == "s2"


# --- The informers ------------------------------------------------------------------------------------------


def lag_lines(resource, key, offset):
    with open(MIRROR_LAG_FILE, "rb") as f:
        f.seek(offset)
        lines = [json.loads(line) for line in f.read().splitlines() if line.strip()]
    return [line for line in lines if line["r"] == resource and line["k"] == key]


def lag_offset():
    return MIRROR_LAG_FILE.stat().st_size if MIRROR_LAG_FILE.exists() else 0


def test_the_informers_account_for_every_event_once(worker_stack, core, namespace):
    """20 label changes made at once (8 at a time): each reaches the mirror exactly once, coalesced or not,
    with its arrival before its commit."""
    offset = lag_offset()
    wait_for(lambda: Namespace.objects.live().filter(name=namespace).exists(), timeout=30, message="the namespace")
    first = Namespace.objects.get(name=namespace).resource_version
    with ThreadPoolExecutor(8) as pool:
        rvs = list(pool.map(lambda i: core.patch_namespace(namespace, {"metadata": {"labels": {"n": str(i)}}}),
                            range(20)))  # fmt: skip
    final = max(int(ns.metadata.resource_version) for ns in rvs)
    wait_for(lambda: Namespace.objects.get(name=namespace).resource_version == final, timeout=30,
             message="the last change in the mirror")  # fmt: skip
    lines = wait_for(lambda: [x for x in lag_lines("namespaces", f"/{namespace}", offset) if int(x["rv"]) > first],
                     timeout=10, message="the lag lines")  # fmt: skip
    assert sum(x["n"] for x in lines) == 20
    assert max(int(x["rv"]) for x in lines) == final
    assert all(0 <= x["c"] - x["a"] < 30 for x in lines)


def test_a_clean_stop_sends_what_the_informers_buffer(worker_stack, core, namespace):
    """Informers holding events for five minutes are stopped with SIGTERM: what they held reaches the
    mirror."""
    worker_stack.stop("informers")
    port, marker = free_port(), None
    env = worker_stack.env() | {"GPUSTACK_INFORMER_BATCH_SECONDS": "300", "GPUSTACK_METRICS_PORT": str(port),
                                "GPUSTACK_METRICS_ADDRESS": "127.0.0.1"}  # fmt: skip

    def relists():
        return InformerState.objects.filter(resource="namespaces").values_list("relists", flat=True).first() or 0

    before = relists()
    log = open(TEST_STATE / "informers-batch-stop.log", "ab")
    proc = subprocess.Popen([sys.executable, "manage.py", "runinformers"], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: relists() > before, timeout=60, message="the informers to list")
        name = f"held-{uuid.uuid4().hex[:6]}"
        seen, sent = informer_counts(port)
        created = core.patch_namespace(namespace, {"metadata": {"labels": {"held": name}}})
        rv = int(created.metadata.resource_version)
        # A namespace created after the change: the informer handles a resource's events in order, so once
        # this one's ADDED is seen, the change went through the sink before it.
        marker = make_namespace(core, "held-marker")
        wait_for(lambda: informer_counts(port)[0] > seen, timeout=30, message="the informers to see the marker")
        assert informer_counts(port)[1] == sent  # nothing of the change was sent: held in the buffer
        assert Namespace.objects.get(name=namespace).resource_version < rv
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        wait_for(lambda: Namespace.objects.get(name=namespace).resource_version >= rv, timeout=20,
                 message="the held change in the mirror")  # fmt: skip
        assert Namespace.objects.get(name=namespace).body["metadata"]["labels"]["held"] == name
        assert Namespace.objects.live().filter(name=marker).exists()  # the rest of the buffer went too
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if marker:
            core.delete_namespace(marker)
        restart_informers(worker_stack)


def informer_counts(port: int) -> tuple[float, float]:
    """Namespace ADDED events the informers saw, and the batches of namespace events they sent."""
    session = requests.Session()
    session.trust_env = False
    text = session.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    seen = sent = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("resource") != "namespaces":
                continue
            if sample.name == "gpustack_models_informer_events_total" and sample.labels.get("type") == "ADDED":
                seen += sample.value
            elif sample.name == "gpustack_models_informer_batches_sent_total":
                sent += sample.value
    return seen, sent


def restart_informers(worker_stack):
    """Start the suite's informers again and wait for their lists, so the next test finds them watching."""
    relists = dict(InformerState.objects.values_list("resource", "relists"))
    worker_stack.start("informers")
    wait_for(lambda: all(InformerState.objects.get(resource=r).relists > n for r, n in relists.items()),
             timeout=60, message="the informers to list again")  # fmt: skip
