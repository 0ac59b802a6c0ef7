"""The upload limits of a node: what the worker writes in ``spec.upload`` from its settings and the Node's
annotations, what the plugin makes of a store's spec (its own settings for what is missing), and applying
new limits to the peer server while transfers run."""

import pytest

from gpustack_models.plugin.peers.peer_server import UploadLimits, connection_limits, set_upload_limits, upload_limits

OWN = (3, 5000)  # the plugin's GPUSTACK_PLUGIN_PEER_MAX_CONNECTIONS, GPUSTACK_PLUGIN_PEER_MAX_BYTES_PER_SECOND


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"upload": {"connections": 1, "bytesPerSecond": 1_000_000}}, (1, 1_000_000)),
        ({"upload": {"connections": 1024, "bytesPerSecond": 0}}, (1024, 0)),
        ({"upload": {"connections": 2}}, (2, 5000)),  # a field left out: the plugin's own
        ({"upload": {"bytesPerSecond": 0}}, (3, 0)),
        ({"upload": {}}, OWN),
        ({}, OWN),  # a worker that writes no upload limits
        (None, OWN),
        ({"upload": None}, OWN),
        ({"upload": [1, 2]}, OWN),
        ({"upload": {"connections": 0, "bytesPerSecond": -1}}, OWN),  # outside the schema's bounds
        ({"upload": {"connections": 1025, "bytesPerSecond": 2**63}}, OWN),
        ({"upload": {"connections": "2", "bytesPerSecond": "10"}}, OWN),
        ({"upload": {"connections": True, "bytesPerSecond": False}}, OWN),
        ({"upload": {"connections": 2.0, "bytesPerSecond": 1.5}}, OWN),
    ],
)
def test_the_plugin_reads_its_upload_limits_from_the_spec_and_keeps_its_own_for_the_rest(spec, expected):
    assert upload_limits(spec, OWN) == expected


def test_new_limits_apply_to_new_transfers_while_running_ones_go_on():
    uploads = UploadLimits(2, 0)
    assert uploads.try_acquire() and uploads.try_acquire()
    assert set_upload_limits(uploads, None, 1, 1000) is True
    assert set_upload_limits(uploads, None, 1, 1000) is False  # nothing changed: nothing to tell
    assert (uploads.limit, uploads.rate.bytes_per_second) == (1, 1000)
    uploads.release()
    assert not uploads.try_acquire()  # one still runs: at the new limit
    uploads.release()
    assert uploads.try_acquire() and not uploads.try_acquire()
    assert set_upload_limits(uploads, None, 3, 0) is True
    assert uploads.try_acquire() and uploads.try_acquire() and not uploads.try_acquire()


def test_the_peer_server_holds_more_connections_than_transfers():
    assert connection_limits(1).connections == 128
    assert connection_limits(1024).connections == 4096


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
