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
