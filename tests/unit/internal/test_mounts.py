"""The pure rules of mounts: the body a plugin sends, the Pod's volume it names, and what an artifact allows to
mount."""

import pytest

from gpustack_models import kube
from gpustack_models.internal.mounts import MountRequest, check_volume, mounted_content, parse_mount, parse_release
from gpustack_models.kube.volumes import MODEL_DRIVER as DRIVER
from gpustack_models.kube.volumes import volume_handle

UID = "0b6c8a9e-3f3c-4c55-9a4e-2f4d2b7c1e10"
DIGEST = "sha256:" + "ab" * 32


def body(**changes):
    out = {
        "node": "gpu-1",
        "volumeId": "csi-" + "f" * 64,
        "pod": {"namespace": "team-a", "name": "server-0", "uid": UID},
        "artifact": "qwen",
        "expectedDigest": None,
    }
    for key, value in changes.items():
        if key.startswith("pod_"):
            out["pod"] = dict(out["pod"], **{key[4:]: value})
        else:
            out[key] = value
    return out


def test_a_well_formed_body_is_read_whole():
    req = parse_mount(body(expectedDigest=DIGEST, pod_uid=UID.upper()))
    assert req == MountRequest("gpu-1", "csi-" + "f" * 64, "team-a", "server-0", UID, "qwen", DIGEST)
    assert parse_mount({k: v for k, v in body().items() if k != "expectedDigest"}).expected_digest is None
    assert parse_release({"node": "gpu-1", "volumeId": "v"}) == ("gpu-1", "v")


@pytest.mark.parametrize(
    "sent, field",
    [
        ([], "the body of the request must be a JSON object"),
        ("node", "the body of the request must be a JSON object"),
        (body(node=None), "node must be"),
        (body(node=7), "node must be"),
        (body(node="../etc"), "node must be"),
        (body(node="Gpu-1"), "node must be"),
        (body(node="a" * 254), "node must be"),
        (body(volumeId=""), "volumeId must be"),
        (body(volumeId="v" * 129), "volumeId must be"),
        (body(volumeId="with space"), "volumeId must be"),
        (body(volumeId="new\nline"), "volumeId must be"),
        (body(volumeId=["v"]), "volumeId must be"),
        (body(pod="team-a/server-0"), "pod must be an object"),
        (body(pod_namespace="a.b"), "pod.namespace must be"),
        (body(pod_namespace="x" * 64), "pod.namespace must be"),
        (body(pod_name="../../secrets/x"), "pod.name must be"),
        (body(pod_name="pods?watch=1"), "pod.name must be"),
        (body(pod_uid="not-a-uid"), "pod.uid must be"),
        (body(pod_uid=12), "pod.uid must be"),
        (body(artifact="qwen/progress"), "artifact must be"),
        (body(artifact="%2e%2e"), "artifact must be"),
        (body(artifact="x" * 10_000), "artifact must be"),
        (body(expectedDigest="sha256:ABC"), "expectedDigest must be"),
        (body(expectedDigest=1), "expectedDigest must be"),
    ],
)
def test_a_malformed_body_is_a_400_naming_the_field(sent, field):
    with pytest.raises(kube.BadRequest) as err:
        parse_mount(sent)
    assert err.value.message.startswith(field)
    assert len(err.value.message) < 200, "the message echoes what was sent"


def artifact(*, source=None, status=None, deleting=False):
    meta = {"name": "qwen", "namespace": "team-a", "resourceVersion": "7"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"source": source or {"huggingFace": {"repository": "Qwen/Qwen2.5"}}},
        "status": status
        if status is not None
        else {"resolved": {"manifestDigest": DIGEST, "sizeBytes": 9, "fileCount": 2}},
    }


REQ = MountRequest("gpu-1", "v", "team-a", "server-0", UID, "qwen")


def test_a_resolved_hub_artifact_answers_its_content():
    answer = mounted_content(artifact(), REQ)
    assert answer == {"digest": DIGEST, "namespace": "team-a", "artifact": "qwen", "sizeBytes": 9, "fileCount": 2}


@pytest.mark.parametrize(
    "obj, req, error, message",
    [
        (artifact(deleting=True), REQ, kube.Conflict, "modelartifact qwen in namespace team-a is being deleted"),
        (
            artifact(source={"persistentVolumeClaim": {"claimName": "models"}}),
            REQ,
            kube.BadRequest,
            "modelartifact qwen takes its files from a volume claim: mount the claim itself",
        ),
        (artifact(status={}), REQ, kube.Conflict, "modelartifact qwen is not resolved yet (Pending: "),
        (
            artifact(status={"conditions": [{"type": "Resolved", "status": "False", "reason": "AccessDenied",
                                             "message": "no access to org/x"}]}),
            REQ,
            kube.Conflict,
            "modelartifact qwen is not resolved yet (AccessDenied: no access to org/x)",
        ),
        (
            artifact(),
            MountRequest("gpu-1", "v", "team-a", "server-0", UID, "qwen", "sha256:" + "00" * 32),
            kube.BadRequest,
            f"expectedDigest sha256:{'00' * 32} does not match the digest of modelartifact qwen, {DIGEST}",
        ),
    ],
)  # fmt: skip
def test_an_artifact_that_cannot_be_mounted_says_why(obj, req, error, message):
    with pytest.raises(error) as err:
        mounted_content(obj, req)
    assert type(err.value) is error and err.value.message.startswith(message)


def pod(*volumes):
    return {"metadata": {"uid": UID}, "spec": {"volumes": list(volumes)}}


def csi(name="model", driver=DRIVER, **attributes):
    return {
        "name": name,
        "csi": {"driver": driver, "readOnly": True, "volumeAttributes": {"artifact": "qwen", **attributes}},
    }


def test_the_volume_asked_for_is_the_pods_own():
    req = MountRequest("gpu-1", volume_handle(UID, "model"), "team-a", "server-0", UID, "qwen")
    assert check_volume(pod({"name": "cache", "emptyDir": {}}, csi()), req) == "model"
    assert check_volume(pod(csi(expectedDigest="")), req) == "model", "an empty expectedDigest is none"
    pinned = MountRequest("gpu-1", req.volume_id, "team-a", "server-0", UID, "qwen", DIGEST)
    assert check_volume(pod(csi(expectedDigest=DIGEST)), pinned) == "model"


@pytest.mark.parametrize(
    "volumes, expected, message",
    [
        ([], None, "volumeId csi-"),
        ([csi("other")], None, "is not the volume id of any volume of pod team-a/server-0"),
        (
            [{"name": "model", "emptyDir": {}}],
            None,
            "volume model of pod team-a/server-0 is not a csi volume of driver",
        ),
        ([csi(driver="other.csi.example.com")], None, "is not a csi volume of driver model.csi.gpustack.ai"),
        ([csi(artifact="llama")], None, "volume model of pod team-a/server-0 does not name modelartifact qwen"),
        ([{"name": "model", "csi": {"driver": DRIVER}}], None, "does not name modelartifact qwen"),
        ([csi(expectedDigest=DIGEST)], None, f"has expectedDigest {DIGEST}, not (none)"),
        ([csi()], DIGEST, f"has expectedDigest (none), not {DIGEST}"),
        ([csi(expectedDigest="sha256:" + "00" * 32)], DIGEST, f"not {DIGEST}"),
    ],
)
def test_a_volume_the_pod_does_not_have_is_refused(volumes, expected, message):
    req = MountRequest("gpu-1", volume_handle(UID, "model"), "team-a", "server-0", UID, "qwen", expected)
    with pytest.raises(kube.Forbidden) as err:
        check_volume(pod(*volumes), req)
    assert message in err.value.message
