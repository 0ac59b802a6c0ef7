"""Kubernetes Events as the worker records them: one series per repeat, a rate limit per object, the
namespace ``kubectl describe`` looks in, and what ``kubectl describe`` shows."""

import uuid

import pytest
from kubernetes import client as k8s


@pytest.fixture
def recorder(worker_kube, monkeypatch, settings):
    """``events.record`` in this process, with the worker's identity and RBAC."""
    from gpustack_models.kube import client
    from gpustack_models.reconcilers import events

    monkeypatch.setattr(client, "_default", worker_kube)
    settings.EVENT_BURST, settings.EVENT_REFILL_SECONDS, settings.EVENT_SERIES_SECONDS = 25, 300.0, 600.0
    return events


def events_of(core, uid: str, namespace: str | None = None) -> list:
    selector = f"involvedObject.uid={uid}"
    if namespace:
        return core.list_namespaced_event(namespace, field_selector=selector).items
    return core.list_event_for_all_namespaces(field_selector=selector).items


def config_map(core, namespace: str) -> dict:
    name = f"cm-{uuid.uuid4().hex[:6]}"
    made = core.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name)))
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "namespace": namespace, "uid": made.metadata.uid}


@pytest.mark.django_db
def test_it_counts_repeats_on_one_event_per_reason(recorder, core, namespace, kubectl):
    regarding = config_map(core, namespace)
    for i in range(100):
        recorder.record(regarding, "Warning", "DownloadFailed", f"attempt {i} failed", series_key="sha256:a")
    recorder.record(regarding, "Normal", "DownloadReady", "ready")
    found = {e.reason: e for e in events_of(core, regarding["uid"], namespace)}
    assert set(found) == {"DownloadFailed", "DownloadReady"}
    failed = found["DownloadFailed"]
    assert failed.count == 100 and failed.message == "attempt 99 failed" and failed.type == "Warning"
    assert failed.source.component == "gpustack-models" and failed.reporting_component == "gpustack-models"
    assert failed.involved_object.kind == "ConfigMap" and failed.involved_object.name == regarding["name"]
    assert failed.first_timestamp and failed.last_timestamp and found["DownloadReady"].count == 1
    described = kubectl("describe", "configmap", regarding["name"], "-n", namespace).stdout
    assert "(x100 over" in described and "DownloadFailed" in described and "DownloadReady" in described, described
    # Another series key of the same reason is another Event.
    recorder.record(regarding, "Warning", "DownloadFailed", "another digest", series_key="sha256:b")
    assert len(events_of(core, regarding["uid"], namespace)) == 3


@pytest.mark.django_db
def test_it_rate_limits_new_events_per_object(recorder, core, namespace, settings):
    settings.EVENT_BURST = 5
    regarding = config_map(core, namespace)
    for i in range(12):
        recorder.record(regarding, "Normal", f"Reason{i}", "something new")
    assert len(events_of(core, regarding["uid"], namespace)) == 5
    other = config_map(core, namespace)  # the limit is per object
    recorder.record(other, "Normal", "Reason0", "something new")
    assert len(events_of(core, other["uid"], namespace)) == 1


@pytest.mark.django_db
def test_it_records_a_cluster_scoped_objects_events_in_default(recorder, core):
    uid = str(uuid.uuid4())
    regarding = {"apiVersion": "worker.gpustack.ai/v1", "kind": "NodeModelStore", "name": "node-x", "uid": uid}
    recorder.record(regarding, "Normal", "DownloadReady", "sha256:0123456789ab (1.0MiB) is ready")
    (event,) = events_of(core, uid)
    assert event.metadata.namespace == "default" and event.involved_object.namespace is None


@pytest.mark.django_db
def test_it_never_fails_the_caller(recorder, core, namespace, monkeypatch):
    from gpustack_models import kube

    def refuse(*args, **kwargs):
        raise RuntimeError("kube-apiserver refused")

    monkeypatch.setattr(kube.Kube, "create", refuse)
    recorder.record(config_map(core, namespace), "Normal", "Anything", "dropped")  # logged, not raised


def test_it_gives_the_worker_events_create_and_patch_only(cluster, kubectl, launcher):
    from django.conf import settings

    sa = f"system:serviceaccount:{settings.NAMESPACE}:{settings.SERVICE_ACCOUNT}"
    for verb, allowed in (("create", "yes"), ("patch", "yes"), ("delete", "no"), ("list", "no")):
        out = kubectl("auth", "can-i", verb, "events", "-n", "default", f"--as={sa}", check=False).stdout.strip()
        assert out == allowed, (verb, out)


def test_it_tells_administrators_what_happened_on_a_node(nodes, worker_kube, core, kubectl, mirror_db):
    from gpustack_models.models import NodeStore
    from tests.support.stores import entry, put_entries, store
    from tests.support.waiting import wait_for

    node = nodes[0]
    uid = wait_for(lambda: (store(worker_kube, node) or {}).get("metadata", {}).get("uid"), message="the store")
    digest = "sha256:" + uuid.uuid4().hex * 2

    def write(entries):  # one status at a time, each seen by the mirror before the next
        rv = int(put_entries(worker_kube, node, entries)["metadata"]["resourceVersion"])
        wait_for(lambda: NodeStore.objects.filter(name=node, resource_version__gte=rv).exists(), message="mirror")

    for _ in range(3):
        write([entry(digest, "Downloading", size=2 * 1024 * 1024)])
        write([entry(digest, "Failed", size=2 * 1024 * 1024, reason="SourceUnavailable")])
    write([entry(digest, "Ready", size=2 * 1024 * 1024)])
    write([])

    def recorded():
        found = {e.reason: e for e in events_of(core, uid, "default")}
        done = {"DownloadStarted", "DownloadFailed", "DownloadReady", "Collected"} <= set(found)
        return done and found["DownloadFailed"].count == 3 and found["DownloadStarted"].count == 3 and found

    found = wait_for(recorded, timeout=30, message="the store's events")
    assert found["DownloadFailed"].type == "Warning" and "SourceUnavailable" in found["DownloadFailed"].message
    assert digest[:19] in found["DownloadReady"].message and "(2.0Mi)" in found["DownloadReady"].message
    described = kubectl("describe", "nodemodelstore", node).stdout
    assert "(x3 over" in described and "Collected" in described, described
