"""The peer endpoints' upload limits, set per node like the download limits: the worker writes
``spec.upload`` of each NodeModelStore from its settings and the Node's annotations, v1 and its OpenAPI carry
the field, kube-apiserver validates it, and a real plugin's peer server follows it while it runs."""

import threading
import time

from gpustack_models.kinds import GROUP
from tests.support import wait_for
from tests.support.stores import store
from tests.support.uploads import BYTES_PER_SECOND, CONNECTIONS, annotate, limit_uploads, plugin_upload_limits
from tests.test_crds import assert_invalid
from tests.test_peers import WEIGHTS, Peer, metric, peer_cert, status_of
from tests.test_plugins import big_files

STORAGE = f"/apis/{GROUP}/v1alpha1"
DEFAULTS = {"connections": 8, "bytesPerSecond": 0}  # GPUSTACK_UPLOAD_CONNECTIONS, GPUSTACK_UPLOAD_BYTES_PER_SECOND
DOWNLOAD = {"concurrency": 8, "bytesPerSecond": 0}

# Annotation values the worker must ignore (the setting stands), each set together with a valid value of
# another annotation, so the spec that carries the valid one shows what became of the bad one.
IGNORED = [
    (CONNECTIONS, "0"),
    (CONNECTIONS, "-1"),
    (CONNECTIONS, "1025"),  # above spec.upload.connections' maximum: the apply would fail
    (CONNECTIONS, "abc"),
    (CONNECTIONS, "1.5"),
    (CONNECTIONS, ""),
    (CONNECTIONS, "9" * 30),
    (BYTES_PER_SECOND, "-5"),
    (BYTES_PER_SECOND, "1e6"),
    (BYTES_PER_SECOND, "9" * 30),  # beyond int64
    (f"{GROUP}/download-concurrency", "257"),  # the download ones are bounded by their schema too
    (f"{GROUP}/download-bytes-per-second", str(2**63)),
]


def _spec(worker_kube, node):
    obj = store(worker_kube, node)
    return obj["spec"] if obj else None


def test_the_worker_writes_each_nodes_upload_limits_from_its_annotations(
    nodes, worker_kube, core, admin_http, cluster, worker_api
):
    node = nodes[0]
    spec = wait_for(lambda: _spec(worker_kube, node), timeout=30, message="the store")
    assert spec["upload"] == DEFAULTS and spec["download"] == DOWNLOAD
    annotate(core, node, {CONNECTIONS: "3", BYTES_PER_SECOND: "123456"})
    wanted = {"connections": 3, "bytesPerSecond": 123456}
    wait_for(lambda: _spec(worker_kube, node)["upload"] == wanted, timeout=30, message="the annotated limits")
    assert _spec(worker_kube, node)["download"] == DOWNLOAD  # the download limits are their own
    # v1 shows the same spec, rewritten to its version.
    resp = admin_http.get(f"{cluster.server}/apis/{GROUP}/v1/nodemodelstores/{node}")
    assert resp.status_code == 200, resp.text
    assert resp.json()["apiVersion"] == f"{GROUP}/v1" and resp.json()["spec"]["upload"] == wanted
    annotate(core, node, {CONNECTIONS: None, BYTES_PER_SECOND: None})
    wait_for(lambda: _spec(worker_kube, node)["upload"] == DEFAULTS, timeout=30, message="the defaults again")


def test_the_worker_ignores_annotations_the_spec_cannot_hold(nodes, worker_kube, core):
    node = nodes[1]
    wait_for(lambda: _spec(worker_kube, node), timeout=30, message="the store")
    for marker, (key, bad) in enumerate(IGNORED, start=1000):
        # The marker: a valid value in a field the bad annotation does not concern.
        marker_key = CONNECTIONS if key != CONNECTIONS else BYTES_PER_SECOND
        annotate(core, node, {CONNECTIONS: None, BYTES_PER_SECOND: None, key: bad, marker_key: str(marker)})
        field = "connections" if marker_key == CONNECTIONS else "bytesPerSecond"
        spec = wait_for(
            lambda field=field, marker=marker: (s := _spec(worker_kube, node))["upload"][field] == marker and s,
            timeout=30,
            message=f"the spec after {key}={bad!r}",
        )
        assert spec["upload"] == dict(DEFAULTS, **{field: marker}), (key, bad)
        assert spec["download"] == DOWNLOAD, (key, bad)
        annotate(core, node, {key: None})


def test_the_kind_validates_and_explains_spec_upload(storage_http, cluster, kubectl, worker_api):
    stores = f"{cluster.server}{STORAGE}/nodemodelstores"
    base = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "NodeModelStore", "metadata": {"name": "upload-bad"}}
    for upload, field in (
        ({"connections": 0}, "spec.upload.connections"),
        ({"connections": 1025}, "spec.upload.connections"),
        ({"connections": "8"}, "spec.upload.connections"),
        ({"bytesPerSecond": -1}, "spec.upload.bytesPerSecond"),
    ):
        assert_invalid(storage_http.post(stores, json=dict(base, spec={"upload": upload})), field)
    # A field left out stays out (no default): the plugin's own setting applies to it.
    created = storage_http.post(stores, json=dict(base, metadata={"name": "upload-partial"}, spec={"upload": {}}))
    assert created.status_code == 201, created.text
    try:
        assert created.json()["spec"]["upload"] == {}
    finally:
        storage_http.delete(f"{stores}/upload-partial")
    out = kubectl("explain", "nodemodelstore.spec.upload").stdout
    assert "VERSION:    v1" in out and "Upload limits of the node's peer endpoints" in out
    assert "connections\t<integer>" in out and "bytesPerSecond\t<integer>" in out
    definitions = served_openapi(worker_api, cluster)["definitions"]
    (nms,) = [d for name, d in definitions.items() if name.endswith(".v1.NodeModelStore")]
    upload = nms["properties"]["spec"]["properties"]["upload"]
    assert upload["properties"]["connections"]["maximum"] == 1024
    assert upload["properties"]["bytesPerSecond"]["minimum"] == 0


def served_openapi(worker_api, cluster) -> dict:
    """The OpenAPI document the API serves (asked of it directly, as kube-apiserver asks)."""
    cert = (str(cluster.pki_path("front-proxy-client.crt")), str(cluster.pki_path("front-proxy-client.key")))
    session = worker_api.session(cert=cert, headers={"X-Remote-User": "admin", "X-Remote-Group": "system:masters"})
    resp = session.get(f"{worker_api.url}/openapi/v2")
    assert resp.status_code == 200, resp.text[:300]
    return resp.json()


def _transfer(peer, cert, path, results, key):
    started = time.monotonic()
    resp = peer.file(path, cert)
    results[key] = (resp, time.monotonic() - started)


def _transfers(peer, cert, count):
    """``count`` transfers of the big file started together; wait until the plugin counts them in flight."""
    results = {}
    threads = [threading.Thread(target=_transfer, args=(peer, cert, WEIGHTS, results, i)) for i in range(count)]
    for thread in threads:
        thread.start()
    uploads = "gpustack_models_plugin_peer_uploads"
    wait_for(lambda: metric(peer.plugin, uploads) == count, timeout=10, message=f"{count} transfers")
    return threads, results


def _finish(threads, results, weights, rate) -> float:
    """Check the transfers' bytes and times under ``rate``; the longest time."""
    for thread in threads:
        thread.join(30)
    seconds = sorted(s for _, s in results.values())
    for resp, _ in results.values():
        assert resp.status_code == 200 and resp.content == weights
    # The peer server takes each chunk (1/20 s of the rate) from the node's limiter before sending it, with at
    # most 50 ms of credit: every byte of every transfer but the last chunk went out at the rate.
    total = len(weights) * len(results)
    assert seconds[-1] >= (total - rate // 20) / rate - 0.05, seconds
    assert seconds[0] >= total / rate * 0.8, seconds  # each held to its share, not to the whole rate
    return seconds[-1]


def test_a_plugin_enforces_the_limits_its_nodes_annotations_set_while_it_runs(scenario, launcher, core):
    scenario.artifact(files=big_files(scenario.repo, mb=2))
    # The plugin's own settings apply only until its store's spec says otherwise.
    own = {"GPUSTACK_PLUGIN_PEER_MAX_CONNECTIONS": 3, "GPUSTACK_PLUGIN_PEER_MAX_BYTES_PER_SECOND": 5_000_000}
    a, b = scenario.plugins(2, **own)
    wait_for(lambda: plugin_upload_limits(a) == (8.0, 0.0), timeout=30, message="the worker's defaults")
    scenario.prefetch([a, b])
    scenario.wait_state(a.node, "Ready", timeout=90)
    scenario.wait_state(b.node, "Ready", timeout=90)
    peer, cert, weights = Peer(a, launcher, scenario.digest), peer_cert(b), scenario.files[WEIGHTS]
    rate = 1_000_000

    limit_uploads(core, scenario.kube, a, connections=1, bytes_per_second=rate)
    threads, results = _transfers(peer, cert, 1)
    busy = peer.file("tokenizer.json", cert)
    assert status_of(busy) == (503, "ServiceUnavailable") and busy.headers["Retry-After"] == "1"
    assert "1 peer transfers are in flight" in busy.json()["message"]
    held = _finish(threads, results, weights, rate)

    limit_uploads(core, scenario.kube, a, connections=2, bytes_per_second=rate)  # raised while it runs
    threads, results = _transfers(peer, cert, 2)
    assert status_of(peer.file("tokenizer.json", cert)) == (503, "ServiceUnavailable")
    _finish(threads, results, weights, rate)

    limit_uploads(core, scenario.kube, a, connections=None, bytes_per_second=None)  # the worker's defaults
    started = time.monotonic()
    whole = peer.file(WEIGHTS, cert)
    unlimited = time.monotonic() - started
    assert whole.status_code == 200 and whole.content == weights
    assert unlimited < held * 0.8, (unlimited, held)  # no longer held to the rate: the same transfer, held above
