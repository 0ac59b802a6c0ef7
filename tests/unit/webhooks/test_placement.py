"""The placement webhook's pure parts: which artifacts a Pod mounts, the JSON Patch that adds one preferred
node-affinity term per artifact while keeping the Pod's own affinity, and the AdmissionReview it reads.
Which nodes hold an artifact (the database), and the webhook through kube-apiserver and the scheduler:
tests/test_placement.py."""

import pytest

from gpustack_models.kinds.placement_labels import label_key
from gpustack_models.kube.errors import BadRequest
from gpustack_models.webhooks.placement import (
    DRIVER,
    MAX_NODES,
    WEIGHT,
    affinity_patch,
    label_preference,
    mounted_artifacts,
    patch_for,
    preference,
    review_request,
)

PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def volume(artifact, driver=DRIVER):
    return {
        "name": f"v-{artifact}",
        "csi": {"driver": driver, "readOnly": True, "volumeAttributes": {"artifact": artifact}},
    }


def model_pod(*artifacts, **spec):
    volumes = [volume(a) for a in artifacts]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"volumes": volumes, **spec}}


def malformed_pod():
    pod = model_pod("qwen", "llama")
    pod["spec"]["volumes"][1]["csi"]["volumeAttributes"]["revision"] = "main"
    return pod


def test_it_reads_the_artifacts_a_pod_mounts_in_order_each_once():
    pod = model_pod("qwen", "llama", "qwen")
    pod["spec"]["volumes"] += [{"name": "data", "emptyDir": {}}, volume("other", driver="ebs.csi.aws.com")]
    assert mounted_artifacts(pod) == ["qwen", "llama"]


@pytest.mark.parametrize(
    "pod",
    [
        {"kind": "Pod", "spec": {"volumes": "not a list"}},
        {"kind": "Pod", "spec": {"volumes": [None, 3, {"csi": "x"}, {"csi": {"driver": DRIVER}}]}},
        {"kind": "Pod", "spec": {"volumes": [{"csi": {"driver": DRIVER, "volumeAttributes": {"artifact": ["x"]}}}]}},
        {"kind": "Pod", "spec": {"volumes": [{"csi": {"driver": DRIVER, "volumeAttributes": ["artifact"]}}]}},
        {"kind": "Pod", "spec": {"volumes": [{"csi": {"driver": DRIVER, "volumeAttributes": {"artifact": ""}}}]}},
        {"kind": "Pod", "spec": None},
        {"kind": "Pod"},
    ],
)  # fmt: skip
def test_a_hostile_or_model_less_pod_mounts_nothing(pod):
    assert mounted_artifacts(pod) == []


def test_a_preference_is_the_lowest_weight_on_the_nodes_names():
    assert WEIGHT == 1 and MAX_NODES == 100
    assert preference(["n1", "n2"]) == {
        "weight": 1,
        "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]},
    }


def test_nothing_to_prefer_is_no_patch():
    assert affinity_patch(model_pod("qwen"), []) == []


@pytest.mark.parametrize("affinity", [None, "garbage"])
def test_a_pod_without_affinity_gets_one(affinity):
    pod = model_pod("qwen", "llama", **({} if affinity is None else {"affinity": affinity}))
    assert affinity_patch(pod, [["n1"], ["n2", "n3"]]) == [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {"nodeAffinity": {PREFERRED: [preference(["n1"]), preference(["n2", "n3"])]}},
        }
    ]


def test_a_pods_other_affinity_is_kept():
    pod = model_pod("qwen", affinity={"podAntiAffinity": {"x": 1}})
    assert affinity_patch(pod, [["n1"]]) == [
        {"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {PREFERRED: [preference(["n1"])]}}
    ]


def test_a_pods_required_node_affinity_is_kept_and_only_a_preference_added():
    required = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]}
    pod = model_pod("qwen", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}})
    assert affinity_patch(pod, [["n1"]]) == [
        {"op": "add", "path": f"/spec/affinity/nodeAffinity/{PREFERRED}", "value": [preference(["n1"])]}
    ]


def test_a_pods_own_preferences_are_kept_and_ours_appended():
    own = {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}}
    pod = model_pod("qwen", "llama", affinity={"nodeAffinity": {PREFERRED: [own]}})
    assert affinity_patch(pod, [["n1"], ["n2"]]) == [
        {"op": "add", "path": f"/spec/affinity/nodeAffinity/{PREFERRED}/-", "value": preference(["n1"])},
        {"op": "add", "path": f"/spec/affinity/nodeAffinity/{PREFERRED}/-", "value": preference(["n2"])},
    ]


def review(**request):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-1", **request}}


def test_it_reads_the_request_of_an_admission_review():
    assert review_request(review(operation="CREATE")) == {"uid": "u-1", "operation": "CREATE"}


V1 = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}


@pytest.mark.parametrize(
    "body, says",
    [
        ([], "expected an AdmissionReview"),
        ({"kind": "Pod", "apiVersion": "admission.k8s.io/v1"}, "expected an AdmissionReview"),
        (V1 | {"apiVersion": "admission.k8s.io/v1beta1"},
         "apiVersion: Unsupported value: 'admission.k8s.io/v1beta1': supported values: admission.k8s.io/v1"),
        (V1 | {"request": {}}, "request.uid: Required value"),
        (V1 | {"request": {"uid": ""}}, "request.uid: Required value"),
        (V1 | {"request": "x"}, "request.uid: Required value"),
    ],
)  # fmt: skip
def test_a_malformed_review_is_a_bad_request_naming_what_is_wrong(body, says):
    with pytest.raises(BadRequest) as raised:
        review_request(body)
    assert raised.value.message == says


@pytest.mark.parametrize(
    "request_",
    [
        {"operation": "UPDATE", "namespace": "team-a", "object": model_pod("qwen")},
        {"operation": "CREATE", "namespace": "team-a", "object": "a string"},
        {"operation": "CREATE", "namespace": "team-a", "object": dict(model_pod("qwen"), kind="Deployment")},
        {"operation": "CREATE", "namespace": "team-a", "object": model_pod("qwen", nodeName="n1")},  # bound
        {"operation": "CREATE", "object": model_pod("qwen")},  # no namespace anywhere
        {"operation": "CREATE", "namespace": "team-a", "object": model_pod()},  # mounts no model
        {"operation": "CREATE", "namespace": "team-a", "object": malformed_pod()},  # the admission policy refuses it
    ],
)
def test_what_it_need_not_place_is_admitted_unchanged_without_looking_for_holders(request_):
    assert patch_for(request_) == []
    assert patch_for(request_, by_labels=True) == []


# --- The node-labels mode: the answer is a function of the request alone -------------------------------


def label_term(namespace, artifact):
    key = label_key(namespace, artifact)
    return {"weight": 1, "preference": {"matchExpressions": [{"key": key, "operator": "Exists"}]}}


def test_by_labels_each_mounted_artifact_prefers_the_nodes_with_its_label():
    assert label_preference("team-a", "qwen") == label_term("team-a", "qwen")
    request_ = {"operation": "CREATE", "namespace": "team-a", "object": model_pod("qwen", "llama", "qwen")}
    assert patch_for(request_, by_labels=True) == [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {"nodeAffinity": {PREFERRED: [label_term("team-a", "qwen"), label_term("team-a", "llama")]}},
        }
    ]


def test_by_labels_the_namespace_of_the_request_wins_and_the_pods_affinity_is_kept():
    own = {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}}
    pod = model_pod("qwen", affinity={"nodeAffinity": {PREFERRED: [own]}})
    pod["metadata"]["namespace"] = "other"
    assert patch_for({"operation": "CREATE", "namespace": "team-a", "object": pod}, by_labels=True) == [
        {"op": "add", "path": f"/spec/affinity/nodeAffinity/{PREFERRED}/-", "value": label_term("team-a", "qwen")}
    ]
    del pod["spec"]["affinity"]
    assert patch_for({"operation": "CREATE", "object": pod}, by_labels=True)[0]["value"] == {
        "nodeAffinity": {PREFERRED: [label_term("other", "qwen")]}
    }


@pytest.mark.parametrize("namespace", [["team-a"], {"a": 1}, 3])
def test_by_labels_a_namespace_that_is_not_a_string_is_admitted_unchanged(namespace):
    assert patch_for({"operation": "CREATE", "namespace": namespace, "object": model_pod("q")}, by_labels=True) == []
