"""The chart's hooks as rendered: the CRD upgrade (pre-install, pre-upgrade), the uninstall (pre-delete) and
``helm test``; their order, RBAC, security context and scheduling values, and a server-side dry run of a
render with every hooks value set. Their commands run in ``tests/test_hooks.py``; the plugin's drain on
uninstall in ``tests/plugin/csi/test_uninstalling.py``."""

from __future__ import annotations

import yaml

from tests.support.helm import CHART, helm_test_account, run_helm
from tests.support.kubernetes import kubectl_run

RELEASE = "models"
HOOKS = ("templates/hooks/crds.yaml", "templates/hooks/uninstall.yaml", "templates/tests/checkinstall.yaml")
ORDER = ["ServiceAccount", ("ClusterRole", "Role"), ("ClusterRoleBinding", "RoleBinding"), ("Job", "Pod")]
SCHEDULING = [
    "--set", "hooks.nodeSelector.pool=system",
    "--set", "hooks.tolerations[0].key=dedicated",
    "--set", "hooks.tolerations[0].operator=Exists",
    "--set", "hooks.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
             ".matchExpressions[0].key=kubernetes.io/os",
    "--set", "hooks.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
             ".matchExpressions[0].operator=Exists",
    "--set", "hooks.priorityClassName=system-cluster-critical",
    "--set", "hooks.hostNetwork=true",
    "--set", "hooks.env.KUBERNETES_SERVICE_HOST=10.0.0.1",
    "--set", "hooks.resources.limits.memory=300Mi",
]  # fmt: skip


def render(helm: str, *args: str, namespace: str = "models-system") -> list[dict]:
    text = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", namespace, *args).stdout
    return [o for o in yaml.safe_load_all(text) if o]


def hooks_of(objects: list[dict]) -> dict[str, list[dict]]:
    by_event: dict[str, list[dict]] = {}
    for o in objects:
        event = (o["metadata"].get("annotations") or {}).get("helm.sh/hook")
        if event:
            by_event.setdefault(event, []).append(o)
    return by_event


def rank(obj: dict) -> int:
    return next(i for i, kinds in enumerate(ORDER) if obj["kind"] in kinds)


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"] if obj["kind"] == "Job" else obj["spec"]


def test_each_hook_creates_its_identity_and_rbac_before_its_pod_and_cleans_up(helm):
    by_event = hooks_of(render(helm))
    assert set(by_event) == {"pre-install,pre-upgrade", "pre-delete", "test"}
    # helm test --logs reads every test hook as a Pod of its name: the Pod is the only one, and stays for it.
    (test_pod,) = by_event.pop("test")
    assert test_pod["kind"] == "Pod"
    assert test_pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
    assert pod_spec(test_pod)["containers"][0]["command"] == [
        "python", "manage.py", "checkinstall", "--tenant", "gpustack-models-test-tenant"
    ]  # fmt: skip
    for event, objects in by_event.items():
        weights = sorted((int(o["metadata"]["annotations"]["helm.sh/hook-weight"]), rank(o)) for o in objects)
        assert [r for _, r in weights] == sorted(r for _, r in weights), (event, weights)
        assert [r for _, r in weights][-1] == 3, "the Job or Pod comes last"
        for o in objects:
            policy = o["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
            assert policy == "before-hook-creation,hook-succeeded", (event, o["kind"])
    commands = {e: pod_spec(o)["containers"][0]["command"] for e, os_ in by_event.items() for o in os_ if rank(o) == 3}
    assert commands == {
        "pre-install,pre-upgrade": ["python", "manage.py", "applycrds", "--timeout", "120"],
        "pre-delete": ["python", "manage.py", "uninstall", "--release", RELEASE, "--timeout", "240"],
    }


def test_the_hooks_rbac_is_least_privilege(helm):
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(helm)}
    crds = objects[("ClusterRole", "gpustack-models-crds")]["rules"]
    assert crds == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": [
                f"{p}.worker.gpustack.ai" for p in ("modelartifacts", "nodemodelstores", "modelprefetches")
            ],
            "verbs": ["get", "create", "patch"],
        }
    ]
    storage = objects[("ClusterRole", "gpustack-models-uninstall")]["rules"]
    assert storage == [
        {
            "apiGroups": ["worker.gpustack.ai"],
            "resources": ["modelartifacts", "modelprefetches", "nodemodelstores"],
            "verbs": ["get", "list", "patch"],
        }
    ]
    local = objects[("Role", "gpustack-models-uninstall")]
    assert local["metadata"]["namespace"] == "models-system"
    scale = next(r for r in local["rules"] if r["resources"] == ["deployments/scale"])
    assert scale["verbs"] == ["patch"] and len(scale["resourceNames"]) == 4
    deleted = [r for r in local["rules"] if "delete" in r["verbs"]]
    assert deleted == [{"apiGroups": [""], "resources": ["pods"], "resourceNames": ["gpustack-models-test"],
                        "verbs": ["delete"]}]  # fmt: skip
    assert objects[("ClusterRole", "gpustack-models-test")]["rules"][0]["resourceNames"] == ["v1.worker.gpustack.ai"]
    token = objects[("Role", "gpustack-models-test")]["rules"]
    assert token == [
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": ["gpustack-models-test-tenant"],
         "verbs": ["create"]}
    ]  # fmt: skip
    bound = {s["name"] for o in objects.values() if o["kind"] in ORDER[2] for s in o["subjects"]}
    assert "gpustack-models-test-tenant" not in bound, "the tenant identity has no grant"


def test_hook_pods_run_restricted_with_the_hooks_scheduling_values(helm):
    for o in (o for objects in hooks_of(render(helm, *SCHEDULING)).values() for o in objects if rank(o) == 3):
        spec = pod_spec(o)
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["restartPolicy"] == "Never"
        (container,) = spec["containers"]
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
        assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["image"].startswith("ghcr.io/gpustack/gpustack-models:")
        assert spec["nodeSelector"] == {"pool": "system"}
        assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
        assert "nodeAffinity" in spec["affinity"] and spec["priorityClassName"] == "system-cluster-critical"
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        env = {e["name"]: e for e in container["env"]}
        assert env["KUBERNETES_SERVICE_HOST"]["value"] == "10.0.0.1"
        assert "secretKeyRef" not in env["SECRET_KEY"]["valueFrom"], "a hook never holds the service's key"
        assert container["resources"]["limits"]["memory"] == "300Mi"


def test_the_hooks_can_be_turned_off_and_the_plugin_carries_the_uninstall_values(helm):
    off = render(helm, "--set", "hooks.crds.enabled=false", "--set", "hooks.uninstall.enabled=false")
    assert set(hooks_of(off)) == {"test"}
    objects = render(helm, "--set", "plugin.uninstall.graceSeconds=600", "--set", "plugin.uninstall.purgeCaches=true")
    plugin = next(o for o in objects if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert plugin["terminationGracePeriodSeconds"] == 600
    mounter = next(c for c in plugin["containers"] if c["name"] == "mounter")
    env = {e["name"]: e.get("value") for e in mounter["env"]}
    assert env["GPUSTACK_PLUGIN_PURGE_ON_UNINSTALL"] == "true"
    path = env["GPUSTACK_PLUGIN_POD_ANNOTATIONS_FILE"]
    mounts = {m["name"]: m["mountPath"] for m in mounter["volumeMounts"]}
    assert path == f"{mounts['pod']}/annotations"
    (volume,) = [v for v in plugin["volumes"] if v["name"] == "pod"]
    field = {"fieldPath": "metadata.annotations"}
    assert volume["downwardAPI"]["items"] == [{"path": "annotations", "fieldRef": field}]
    refused = run_helm(helm, "template", RELEASE, str(CHART), "--set", "hooks.nosuch=1", check=False)
    assert refused.returncode != 0 and "nosuch" in refused.stderr


def test_the_hooks_pass_a_server_side_dry_run_with_every_value_set(helm, cluster, namespace):
    shown = [arg for template in HOOKS for arg in ("--show-only", template)]
    objects = render(helm, *SCHEDULING, *shown, namespace=namespace)
    # A Pod's ServiceAccount must exist (a dry run creates none): the test Pod's, for real.
    kubectl_run(cluster, "apply", "-f", "-", input=helm_test_account(namespace, RELEASE))
    out = kubectl_run(cluster, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(objects)).stdout
    applied = [line for line in out.splitlines() if line.strip()]
    assert len(applied) == len(objects) and all("(server dry run)" in line for line in applied), out
