"""What a kubelet waits for when it mounts a model already Ready on its node: NodePublishVolume (the
request checked, the worker asked with the plugin's bound token, the mount reference recorded, the read-only
bind mount made) and NodeUnpublishVolume, over the plugin's real unix socket. Target: publish p50 <= 50 ms."""

import statistics
import time

from tests.support.pods import model_volume, volume_handle
from tests.test_csi import Kubelet, is_mount_point, make_pod, pod_context, target_in
from tests.test_plugins import Scenario


def test_node_publish_volume_of_a_ready_model(
    worker_stack, worker_api, hub, worker_kube, admin_http, cluster, namespace, start_plugin, core, tmp_path,
    bench_scale, record,
):  # fmt: skip
    scenario = Scenario(hub, worker_kube, admin_http, cluster, namespace, start_plugin)
    pods = tmp_path / "kubelet" / "pods"
    pods.mkdir(parents=True)
    scenario.artifact()
    (plugin,) = scenario.plugins(1, GPUSTACK_PLUGIN_KUBELET_DIR=pods.parent)
    scenario.prefetch([plugin])
    scenario.wait_state(plugin.node, "Ready")
    count = 100 if bench_scale == "full" else 5
    uid = make_pod(core, namespace, plugin.node, volumes=[model_volume(f"model-{i}", "art") for i in range(count)])
    kubelet = Kubelet(plugin)
    context = pod_context(namespace, uid=uid)
    publish, unpublish = [], []
    for i in range(count):
        target = target_in(pods, uid, volume=f"model-{i}")
        t0 = time.perf_counter()
        kubelet.publish(volume_handle(uid, f"model-{i}"), target, context)
        publish.append((time.perf_counter() - t0) * 1000)
        assert is_mount_point(target)
        t0 = time.perf_counter()
        kubelet.unpublish(volume_handle(uid, f"model-{i}"), target)
        unpublish.append((time.perf_counter() - t0) * 1000)
        assert not is_mount_point(target)
    p50, p90 = statistics.median(publish), sorted(publish)[int(count * 0.9) - 1]
    assert len(publish) == len(unpublish) == count and min(publish) > 0 and min(unpublish) > 0
    assert p50 <= p90, (p50, p90)
    record(
        f"NodePublishVolume of a Ready model ({count} volumes): p50 {p50:.1f} ms "
        f"(target <= 50 ms), p90 {p90:.1f} ms; "
        f"NodeUnpublishVolume p50 {statistics.median(unpublish):.1f} ms"
    )
