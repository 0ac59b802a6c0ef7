"""The kubelet's volume ids of a Pod's inline CSI volumes, and the volume of a Pod an id names."""

from gpustack_models.kube.volumes import MODEL_DRIVER, model_attributes, volume_handle, volume_of

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
