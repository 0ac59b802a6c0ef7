"""When a mount reference ends: with its Pod (gone, replaced, elsewhere, finished, without that volume) or its
node."""

import pytest

from gpustack_models.kube.volumes import MODEL_DRIVER, volume_handle
from gpustack_models.reconcilers.mount_checks import ended_because

UID = "0b6c8a9e-3f3c-4c55-9a4e-2f4d2b7c1e10"
VOLUME = volume_handle(UID, "model")


def model(name="model", artifact="qwen", driver=MODEL_DRIVER):
    return {"name": name, "csi": {"driver": driver, "volumeAttributes": {"artifact": artifact}}}


def pod(uid=UID, node="gpu-1", phase="Pending", volumes=None):
    spec = {"nodeName": node, "volumes": [model()] if volumes is None else volumes}
    return {"metadata": {"uid": uid}, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(
    "found, node_present, why",
    [
        (pod(), True, ""),
        (pod(phase="Running"), True, ""),
        (pod(), False, "node gpu-1 is gone"),
        (None, True, "the Pod is gone"),
        (pod(uid="other"), True, "the Pod was replaced (another uid)"),
        (pod(node="gpu-2"), True, "the Pod is not on node gpu-1"),
        (pod(phase="Succeeded"), True, "the Pod finished (Succeeded)"),
        (pod(phase="Failed"), True, "the Pod finished (Failed)"),
        (pod(volumes=[]), True, "the Pod has no model volume of that id mounting qwen"),
        (pod(volumes=[model("other")]), True, "the Pod has no model volume of that id mounting qwen"),
        (pod(volumes=[model(artifact="llama")]), True, "the Pod has no model volume of that id mounting qwen"),
        (
            pod(volumes=[model(driver="other.example.com")]),
            True,
            "the Pod has no model volume of that id mounting qwen",
        ),
        (
            pod(volumes=[{"name": "model", "emptyDir": {}}]),
            True,
            "the Pod has no model volume of that id mounting qwen",
        ),
    ],
)
def test_a_mount_reference_ends_with_its_pod_or_its_node(found, node_present, why):
    assert ended_because("gpu-1", UID, found, node_present, VOLUME, "qwen") == why
