"""The upload limits the worker writes in a NodeModelStore's ``spec.upload``, from its settings and the
Node's annotations."""

import pytest


@pytest.mark.parametrize(
    "annotations, upload",
    [
        ({}, {"connections": 8, "bytesPerSecond": 0}),
        ({"worker.gpustack.ai/upload-connections": "2"}, {"connections": 2, "bytesPerSecond": 0}),
        (
            {"worker.gpustack.ai/upload-connections": "1024", "worker.gpustack.ai/upload-bytes-per-second": "7"},
            {"connections": 1024, "bytesPerSecond": 7},
        ),
        ({"worker.gpustack.ai/upload-connections": "1025"}, {"connections": 8, "bytesPerSecond": 0}),
        ({"worker.gpustack.ai/upload-connections": "0"}, {"connections": 8, "bytesPerSecond": 0}),
        ({"worker.gpustack.ai/upload-connections": " 4 "}, {"connections": 4, "bytesPerSecond": 0}),
        ({"worker.gpustack.ai/upload-bytes-per-second": "-1"}, {"connections": 8, "bytesPerSecond": 0}),
        ({"worker.gpustack.ai/upload-bytes-per-second": str(2**63)}, {"connections": 8, "bytesPerSecond": 0}),
        ({"worker.gpustack.ai/upload-bytes-per-second": "fast"}, {"connections": 8, "bytesPerSecond": 0}),
    ],
)
def test_the_worker_writes_the_nodes_upload_limits_and_ignores_bad_annotations(annotations, upload):
    from gpustack_models.reconcilers.node_stores import store_spec

    spec = store_spec(annotations, [])
    assert spec["upload"] == upload
    assert spec["download"] == {"concurrency": 8, "bytesPerSecond": 0}  # the download limits are their own


def test_the_worker_takes_its_defaults_from_its_settings(settings):
    from gpustack_models.reconcilers.node_stores import store_spec

    settings.UPLOAD_CONNECTIONS, settings.UPLOAD_BYTES_PER_SECOND = 16, 250_000
    assert store_spec({}, [])["upload"] == {"connections": 16, "bytesPerSecond": 250_000}
    bad = {"worker.gpustack.ai/upload-connections": "many", "worker.gpustack.ai/download-concurrency": "257"}
    spec = store_spec(bad, [])
    assert spec["upload"] == {"connections": 16, "bytesPerSecond": 250_000}
    assert spec["download"]["concurrency"] == 8  # above the spec's maximum: the setting stands


def test_a_digest_the_node_reports_is_rolled_up_again_when_it_enters_or_leaves_spec_models(monkeypatch):
    """Its entry starts or stops counting then, although the entry itself did not change."""
    from gpustack_models.reconcilers import node_stores
    from gpustack_models.reconcilers.task_names import ROLLUP_DIGEST

    reported, unreported = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    sent = []
    monkeypatch.setattr(node_stores, "enqueue", lambda name, *args: sent.append((name, *args)))

    def store(models):
        entries = [{"digest": reported, "state": "Ready"}]
        return {"spec": {"models": [{"digest": d} for d in models]}, "status": {"models": entries}}

    for before, after in ((store([]), store([reported, unreported])), (store([reported]), store([]))):
        sent.clear()
        node_stores.reconcile_and_roll_up(before, after, "", "node-1")
        assert [s for s in sent if s[0] == ROLLUP_DIGEST] == [(ROLLUP_DIGEST, reported)]
    sent.clear()
    node_stores.reconcile_and_roll_up(store([reported]), store([reported]), "", "node-1")
    assert sent == []
