"""The chart's placement mode (``placement.mode``): the environment of the API and the worker, the Node right
of the node-labels mode (rendered in that mode, or to clean its labels up, and nowhere else), the admission
policy keeping the service's Node writes to those labels, and a mode the schema does not know refused."""

from __future__ import annotations

import pytest

from tests.support.helm import CHART, run_helm
from tests.test_chart import NS, RELEASE, by_kind, render

NODE_LABELS = ["--set", "placement.mode=nodeLabels"]
LABEL_WRITER = "gpustack-models-worker:placement-labels"


def env_of(objects: list[dict], deployment: str) -> dict:
    (container,) = by_kind(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][:1]
    return {e["name"]: e.get("value") for e in container["env"]}


def node_rights(objects: list[dict]) -> list[dict]:
    """Every rule of the chart's ClusterRoles that touches Nodes beyond reading them."""
    rules = []
    for role in (o for o in objects if o["kind"] == "ClusterRole"):
        for rule in role.get("rules") or []:
            if "nodes" in rule.get("resources", []) and set(rule["verbs"]) - {"get", "list", "watch"}:
                rules.append({"role": role["metadata"]["name"], **rule})
    return rules


def test_by_default_placement_uses_the_client_certificate_and_nobody_may_patch_nodes(helm):
    objects = render(helm)
    assert env_of(objects, "gpustack-models-api")["GPUSTACK_PLACEMENT_MODE"] == "clientCertificate"
    assert env_of(objects, "gpustack-models-worker")["GPUSTACK_PLACEMENT_MODE"] == "clientCertificate"
    assert node_rights(objects) == []
    assert not [o for o in objects if o["metadata"]["name"] == LABEL_WRITER]
    by_kind(objects, "ClusterRoleBinding", "gpustack-models:placement-caller")  # the caller's right stays


def test_the_node_labels_mode_lets_the_service_patch_nodes_and_nothing_more(helm):
    objects = render(helm, *NODE_LABELS)
    assert env_of(objects, "gpustack-models-api")["GPUSTACK_PLACEMENT_MODE"] == "nodeLabels"
    assert env_of(objects, "gpustack-models-worker")["GPUSTACK_PLACEMENT_MODE"] == "nodeLabels"
    assert node_rights(objects) == [{"role": LABEL_WRITER, "apiGroups": [""], "resources": ["nodes"],
                                     "verbs": ["get", "patch"]}]  # fmt: skip
    binding = by_kind(objects, "ClusterRoleBinding", LABEL_WRITER)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpustack-models-worker", "namespace": NS}]
    # The admission policy keeping the service's Node writes to the placement labels, in every mode.
    policy = by_kind(objects, "ValidatingAdmissionPolicy", "gpustack-models-node-writes")
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
    by_kind(objects, "ValidatingAdmissionPolicyBinding", "gpustack-models-node-writes")

    # The webhook's configuration is the same: kube-apiserver calls it without a credential either way.
    def webhook(rendered):  # its CA bundle aside (the chart makes a CA per render)
        (hook,) = by_kind(rendered, "MutatingWebhookConfiguration", "gpustack-models-placement")["webhooks"]
        return dict(hook, clientConfig={k: v for k, v in hook["clientConfig"].items() if k != "caBundle"})

    assert webhook(objects) == webhook(render(helm))
    # The volume warnings' webhook is not installed (it would answer anyone); the volumes' policy still is.
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert not {("ValidatingWebhookConfiguration", "gpustack-models-volumes"),
                ("ClusterRole", "gpustack-models:volume-warnings-caller")} & names  # fmt: skip
    assert ("ValidatingAdmissionPolicy", "gpustack-models-model-volumes") in names


def test_leaving_the_mode_may_keep_the_right_to_remove_the_labels(helm):
    objects = render(helm, "--set", "placement.cleanUpNodeLabels=true")
    assert env_of(objects, "gpustack-models-worker")["GPUSTACK_PLACEMENT_MODE"] == "clientCertificate"
    assert [r["role"] for r in node_rights(objects)] == [LABEL_WRITER]


@pytest.mark.parametrize("value", ["labels", "NodeLabels", ""])
def test_an_unknown_mode_is_refused_by_the_schema(helm, value):
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NS, "--set", f"placement.mode={value}",
                    check=False)  # fmt: skip
    assert proc.returncode != 0
    assert "placement.mode" in proc.stderr or "placement/mode" in proc.stderr, proc.stderr


def test_lint_strict_passes_in_the_node_labels_mode(helm):
    for values in (NODE_LABELS, ["--set", "placement.cleanUpNodeLabels=true"]):
        out = run_helm(helm, "lint", "--strict", str(CHART), *values)
        assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout, out.stdout
