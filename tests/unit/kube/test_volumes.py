"""The kubelet's volume ids of a Pod's inline CSI volumes, the volume of a Pod an id names, and what is wrong
with a model volume (the rules the admission policy and the webhooks share with the driver)."""

from gpustack_models.kube.volumes import (
    MODEL_DRIVER,
    model_attributes,
    pod_problems,
    volume_handle,
    volume_of,
    volume_problems,
)

UID = "0b6c8a9e-3f3c-4c55-9a4e-2f4d2b7c1e10"


def test_the_volume_id_is_the_kubelets_handle():
    # Kubernetes' makeVolumeHandle (pkg/volume/csi/csi_mounter.go), run in Go for this uid and name.
    assert volume_handle(UID, "model") == "csi-9b9e28cede3df043a54fe09fcd48a7ba9f3f282b5fdc279e40ece064fcfde2b0"
    assert volume_handle(UID, "model2") != volume_handle(UID, "model")


def test_an_id_names_the_volume_of_that_pod_only():
    model = {"name": "model", "csi": {"driver": MODEL_DRIVER, "volumeAttributes": {"artifact": "qwen"}}}
    pod = {"metadata": {"uid": UID}, "spec": {"volumes": [None, "x", {"name": "cache", "emptyDir": {}}, model]}}
    assert volume_of(pod, volume_handle(UID, "model")) is model
    assert volume_of(pod, volume_handle(UID, "cache"))["name"] == "cache"
    assert volume_of(pod, volume_handle("1" + UID[1:], "model")) is None, "another Pod's volume"
    assert volume_of(pod, "csi-" + "0" * 64) is None
    assert volume_of({"metadata": {"uid": UID}, "spec": {}}, volume_handle(UID, "model")) is None


def test_only_a_volume_of_the_model_driver_has_model_attributes():
    assert model_attributes({"csi": {"driver": MODEL_DRIVER, "volumeAttributes": {"artifact": "a"}}}) == {
        "artifact": "a"
    }
    assert model_attributes({"csi": {"driver": MODEL_DRIVER}}) == {}
    assert model_attributes({"csi": {"driver": "other.example.com", "volumeAttributes": {"artifact": "a"}}}) is None
    assert model_attributes({"emptyDir": {}}) is None
    assert model_attributes({"csi": "x"}) is None


def model_volume(name="m", read_only=True, **attributes):
    csi = {"driver": MODEL_DRIVER, "volumeAttributes": attributes}
    if read_only is not None:
        csi["readOnly"] = read_only
    return {"name": name, "csi": csi}


def test_a_well_formed_model_volume_has_no_problem_and_other_volumes_are_not_looked_at():
    digest = "sha256:" + "a" * 64
    volumes = [
        {"name": "cache", "emptyDir": {}},
        {"name": "ebs", "csi": {"driver": "ebs.csi.aws.com", "volumeAttributes": {"revision": "x"}}},
        model_volume(artifact="qwen.v2", expectedDigest=digest),
        model_volume(artifact="llama", expectedDigest="", **{"csi.storage.k8s.io/pod.name": "p"}),
    ]
    assert pod_problems({"spec": {"volumes": volumes}}) == []
    for hostile in (None, "x", {"spec": None}, {"spec": {"volumes": "x"}}, {"spec": {"volumes": [None, 3]}}):
        assert pod_problems(hostile) == []


def test_each_problem_names_its_field_in_the_admission_policys_words():
    path = "spec.volumes[1].csi"
    volumes = [
        {"name": "cache", "emptyDir": {}},
        model_volume(read_only=None, artifact="Qwen", revision="main", expectedDigest="sha256:x", zeta="1"),
        model_volume(read_only=False),
    ]
    assert pod_problems({"spec": {"volumes": volumes}}) == [
        f'{path}.volumeAttributes: unknown attribute "revision": model volumes take artifact, expectedDigest',
        f'{path}.volumeAttributes: unknown attribute "zeta": model volumes take artifact, expectedDigest',
        f"{path}.volumeAttributes.artifact: must be a ModelArtifact name (a DNS subdomain of at most 253 characters)",
        f"{path}.volumeAttributes.expectedDigest: must be sha256:<64 lowercase hex digits>",
        f"{path}.readOnly: must be true for model volumes",
        "spec.volumes[2].csi.volumeAttributes.artifact: required: the name of a ModelArtifact in the Pod's namespace",
        "spec.volumes[2].csi.readOnly: must be true for model volumes",
    ]
    assert volume_problems(0, model_volume(artifact="a" * 254))[0].endswith("at most 253 characters)")
    assert volume_problems(0, model_volume(artifact=["x"]))[0].endswith("at most 253 characters)")
