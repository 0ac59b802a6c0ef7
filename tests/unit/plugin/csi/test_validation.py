"""What a publish request from the kubelet must carry, each refusal naming the field."""

from __future__ import annotations

import grpc
import pytest

from gpustack_models.plugin.csi import validation
from gpustack_models.plugin.csi.generated import csi_pb2
from gpustack_models.plugin.csi.validation import CsiError, Pod

Mode = csi_pb2.VolumeCapability.AccessMode
UID = "0b3f6f0e-7a51-4e6f-9d1e-6a1c5e0f0c11"


def request(**changes):
    context = {
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/pod.namespace": "team-a",
        "csi.storage.k8s.io/pod.name": "consumer-0",
        "csi.storage.k8s.io/pod.uid": UID,
        "csi.storage.k8s.io/serviceAccount.name": "default",
        "artifact": "qwen",
    }
    context.update(changes.pop("context", {}))
    context = {k: v for k, v in context.items() if v is not None}
    cap = csi_pb2.VolumeCapability(access_mode=Mode(mode=changes.pop("mode", Mode.SINGLE_NODE_WRITER)))
    cap.mount.SetInParent()
    fields = dict(volume_id="csi-abc", target_path="/var/lib/kubelet/pods/p/volumes/v/mount", readonly=True)
    fields.update(changes)
    return csi_pb2.NodePublishVolumeRequest(volume_capability=cap, volume_context=context, **fields)


def refusal(req, kubelet_dir="/var/lib/kubelet") -> str:
    with pytest.raises(CsiError) as info:
        validation.publish_request(req, kubelet_dir)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return info.value.message


def test_it_reads_what_the_kubelet_sends_for_an_inline_volume():
    got = validation.publish_request(request(context={"expectedDigest": "sha256:" + "a" * 64}), "/var/lib/kubelet")
    assert got.pod == Pod("team-a", "consumer-0", UID) and got.artifact == "qwen"
    assert got.expected_digest == "sha256:" + "a" * 64 and got.volume_id == "csi-abc"
    for mode in (Mode.SINGLE_NODE_READER_ONLY, Mode.MULTI_NODE_READER_ONLY):
        assert validation.publish_request(request(mode=mode), None).artifact == "qwen"


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(volume_id=""), "volume_id is required"),
        (dict(target_path=""), "target_path is required"),
        (dict(readonly=False), "readOnly: true"),
        (dict(mode=Mode.MULTI_NODE_MULTI_WRITER), "MULTI_NODE_MULTI_WRITER"),
        (dict(context={"csi.storage.k8s.io/ephemeral": None}), "inline ephemeral"),
        (dict(context={"csi.storage.k8s.io/pod.uid": None}), "pod.uid"),
        (dict(context={"csi.storage.k8s.io/pod.namespace": "Team_A"}), "namespace"),
        (dict(context={"artifact": None}), "artifact is required"),
        (dict(context={"artifact": "../x"}), "not a ModelArtifact name"),
        (dict(context={"artifactRef": "qwen"}), "unknown volume attributes"),
        (dict(context={"expectedDigest": "sha256:ABC"}), "sha256:<64 hex digits>"),
        (dict(target_path="/var/lib/kubelet/pods/../../../etc"), "normalised"),
        (dict(target_path="/etc/passwd"), "not under the kubelet's pods directory"),
        (dict(target_path="/var/lib/kubelet/podsX/a"), "not under the kubelet's pods directory"),
        (dict(volume_id="v" * 129), "at most 128 bytes"),
        (dict(volume_id="a\tb"), "printable"),
    ],
)
def test_it_refuses_what_is_missing_or_hostile_naming_the_field(changes, says):
    assert says in refusal(request(**changes))


def test_it_requires_a_capability():
    req = request()
    req.ClearField("volume_capability")
    assert "volume_capability is required" in refusal(req)
