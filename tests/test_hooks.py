"""The chart's hooks as real processes against the control plane, each with the identity and RBAC the chart
renders for it: ``manage.py uninstall`` (pre-delete), ``applycrds`` (pre-install, pre-upgrade) and
``checkinstall`` (``helm test``). The hooks cannot run in ``test_chart`` (no node runs a Pod there)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import uuid

import pytest
import yaml

from gpustack_models import kube
from gpustack_models.install.crd_upgrade import CRDS, FIELD_MANAGER
from gpustack_models.install.uninstall import UNINSTALLING
from gpustack_models.kinds import MODEL_PREFETCH
from gpustack_models.kinds.crd import crd_for
from gpustack_models.models import MOUNT_PROTECTION
from tests.support.cluster import fresh_namespace
from tests.support.helm import CHART, run_helm
from tests.support.kubernetes import kubectl_run, wait_default_service_account
from tests.support.paths import REPO
from tests.support.pods import model_volume
from tests.support.waiting import wait_for

RELEASE = "hooked"
UNSCHEDULABLE = {"gpustack.ai/test-no-such-node": "true"}  # Pods that stay Pending and go at once


def hook_objects(helm: str, template: str, namespace: str) -> list[dict]:
    """The chart's ``template`` for a release in ``namespace``: its ServiceAccounts and RBAC (no Pod, no Job;
    for ``helm test`` they are part of the release)."""
    text = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", namespace, "--show-only", template).stdout
    return [o for o in yaml.safe_load_all(text) if o and o["kind"] not in ("Job", "Pod")]


def identity(cluster, launcher, helm, template: str, namespace: str, account: str, tmp_path) -> str:
    """Apply the chart's RBAC of ``template`` and return a kubeconfig with a token of ``account``."""
    kubectl_run(cluster, "apply", "-f", "-", input=yaml.safe_dump_all(hook_objects(helm, template, namespace)))
    wait_default_service_account(launcher.admin, namespace)
    review = launcher.admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    return kubeconfig_with(cluster, review["status"]["token"], tmp_path / f"{account}.kubeconfig")


def kubeconfig_with(cluster, token: str, path) -> str:
    config = yaml.safe_load(cluster.token_kubeconfig.read_text())
    config["users"] = [{"name": "hook", "user": {"token": token}}]
    config["contexts"] = [{"name": "local", "context": {"cluster": "local", "user": "hook"}}]
    path.write_text(yaml.safe_dump(config))
    return str(path)


def manage(kubeconfig: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def controller(namespace: str, component: str) -> dict:
    """A Deployment of the release as the chart labels it, whose Pods are never scheduled."""
    labels = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": component}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"gpustack-models-{component}", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": UNSCHEDULABLE, "containers": [{"name": "c", "image": "example.invalid/c"}]},
            },
        },
    }


def pending_pod(namespace: str, name: str, labels: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeSelector": UNSCHEDULABLE, "containers": [{"name": "c", "image": "example.invalid/c"}]},
    }


def plugin_pod(namespace: str) -> dict:
    labels = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/name": "gpustack-models-plugin"}
    return pending_pod(namespace, "plugin-x", labels)


def controllers(admin: kube.Kube, namespace: str, components: tuple[str, ...]) -> None:
    """Each controller as a Deployment of the release: kube-controller-manager's Deployment and ReplicaSet
    controllers make its Pods (never scheduled) and remove them once it is scaled to 0."""
    for component in components:
        admin.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", controller(namespace, component))


def pods(admin: kube.Kube, namespace: str, selector: str) -> list[dict]:
    return admin.get(f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector})["items"]


@pytest.fixture
def release_ns(core):
    yield from fresh_namespace(core)


def test_uninstall_stops_the_controllers_marks_the_plugins_and_frees_namespaces(
    mounts, release_ns, cluster, launcher, helm, tmp_path
):
    admin = launcher.admin
    pod = mounts.pod(volumes=[model_volume("model", mounts.artifact, mounts.digest)])
    assert mounts.post(mounts.body(pod, expectedDigest=mounts.digest)).status_code == 200
    assert MOUNT_PROTECTION in mounts.finalizers(), "the product protects the mounted artifact"
    wait_default_service_account(admin, release_ns)
    controllers(admin, release_ns, ("worker", "beat"))
    admin.create(f"/api/v1/namespaces/{release_ns}/pods", plugin_pod(release_ns))
    admin.create(f"/api/v1/namespaces/{release_ns}/pods", pending_pod(release_ns, "gpustack-models-test", {}))
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component in (worker,beat)"
    wait_for(lambda: len(pods(admin, release_ns, selector)) == 4, timeout=30, message="the controllers' 4 Pods")
    hook = identity(cluster, launcher, helm, "templates/hooks/uninstall.yaml", release_ns, "gpustack-models-uninstall",
                    tmp_path)  # fmt: skip

    out = manage(hook, "uninstall", "--release", RELEASE, "--namespace", release_ns, "--timeout", "60")
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stderr
    assert "plugin Pods marked as uninstalling: 1" in out.stdout
    assert "controllers stopped: 2 deployments, no Pod left" in out.stdout
    assert "modelartifacts: finalizers removed from 1 of" in out.stdout
    assert "deleted the test Pod gpustack-models-test" in out.stdout
    assert pods(admin, release_ns, selector) == []
    marked = admin.get(f"/api/v1/namespaces/{release_ns}/pods/plugin-x")
    assert marked["metadata"]["annotations"][UNINSTALLING] == "true"
    assert MOUNT_PROTECTION not in mounts.finalizers()

    again = manage(hook, "uninstall", "--release", RELEASE, "--namespace", release_ns, "--timeout", "60")
    assert again.returncode == 0 and "modelartifacts: finalizers removed from 0 of" in again.stdout, again.stderr

    mounts.delete_pod(pod)  # no kubelet here to end it (a node's plugin unmounts it: tests/plugin)
    admin.delete(f"/api/v1/namespaces/{mounts.ns}")
    wait_for(lambda: not mounts.artifact_object(), timeout=60, message="the tenant's artifact deleted")

    def gone():
        try:
            admin.get(f"/api/v1/namespaces/{mounts.ns}")
        except kube.NotFound:
            return True
        return False

    wait_for(gone, timeout=60, message="the tenant namespace deleted")


def test_the_uninstall_identity_changes_metadata_only_and_a_refused_run_fails_clearly(
    resolved, namespace, release_ns, cluster, launcher, helm, tmp_path, worker_kube
):
    hook = identity(cluster, launcher, helm, "templates/hooks/uninstall.yaml", release_ns, "gpustack-models-uninstall",
                    tmp_path)  # fmt: skip
    client = kube.Kube(kube.load_configuration(hook))
    path = f"/apis/worker.gpustack.ai/v1alpha1/namespaces/{namespace}/modelartifacts/{resolved[0]}"
    patch = {"spec": {"source": {"huggingFace": {"repository": "org/other"}}}}
    with pytest.raises((kube.Forbidden, kube.Invalid)):  # immutable, and the service's alone
        client.json("PATCH", path, body=patch, content_type="application/merge-patch+json")
    with pytest.raises(kube.Forbidden):
        client.json("PATCH", f"{path}/status", body={"status": {}}, content_type="application/merge-patch+json")
    with pytest.raises(kube.Forbidden):  # nothing but the storage kinds' metadata, and its own namespace
        client.get(f"/api/v1/namespaces/{namespace}/secrets")

    nobody = kubeconfig_with(cluster, "not-a-token", tmp_path / "nobody.kubeconfig")
    out = manage(nobody, "uninstall", "--release", RELEASE, "--namespace", release_ns)
    assert out.returncode != 0
    assert "uninstall did not finish" in out.stderr and "Unauthorized" in out.stderr, out.stderr


def older(crd: dict) -> dict:
    """The CRD as an older chart had it: a spec field and a printer column fewer."""
    old = copy.deepcopy(crd)
    version = old["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    spec.pop(sorted(spec)[-1])
    version["additionalPrinterColumns"] = version["additionalPrinterColumns"][:-1]
    return old


def test_applycrds_upgrades_an_older_crd_server_side_and_waits_for_it(cluster, launcher, helm, tmp_path):
    admin = launcher.admin
    current = crd_for(MODEL_PREFETCH)
    name = current["metadata"]["name"]
    admin.apply(f"{CRDS}/{name}", older(current), field_manager="helm", force=True)
    served = admin.get(f"{CRDS}/{name}")["spec"]["versions"][0]
    assert served["schema"] != current["spec"]["versions"][0]["schema"], "the older CRD is in place"
    hook = identity(cluster, launcher, helm, "templates/hooks/crds.yaml", "gpustack-system", "gpustack-models-crds",
                    tmp_path)  # fmt: skip

    out = manage(hook, "applycrds", "--timeout", "60")
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stderr
    assert f"{name} is Established" in out.stdout and "CRDs applied: 3" in out.stdout
    crd = admin.get(f"{CRDS}/{name}")
    version = crd["spec"]["versions"][0]
    assert version["schema"] == current["spec"]["versions"][0]["schema"]
    assert version["additionalPrinterColumns"] == current["spec"]["versions"][0]["additionalPrinterColumns"]
    assert FIELD_MANAGER in {m["manager"] for m in crd["metadata"]["managedFields"]}

    client = kube.Kube(kube.load_configuration(hook))
    with pytest.raises(kube.Forbidden):  # its identity touches these three CRDs alone
        client.get(f"{CRDS}/leases.coordination.k8s.io")


def test_checkinstall_passes_on_the_running_stack_and_fails_when_the_tenant_is_allowed(
    worker_api, cluster, launcher, helm, tmp_path
):
    ns = "gpustack-system"
    hook = identity(cluster, launcher, helm, "templates/tests/checkinstall.yaml", ns, "gpustack-models-test", tmp_path)
    out = manage(hook, "checkinstall", "--tenant", "gpustack-models-test-tenant", "--namespace", ns)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("PASS ") == 3 and "HTTP 403" in out.stdout

    client = kube.Kube(kube.load_configuration(hook))
    with pytest.raises(kube.Forbidden):  # it may request a token for the tenant account alone
        client.create(
            f"/api/v1/namespaces/{ns}/serviceaccounts/gpustack-models-worker/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )

    tenant = f"tenant-{uuid.uuid4().hex[:6]}"
    admin = launcher.admin
    admin.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": tenant}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    rule = {"apiGroups": ["worker.gpustack.ai"], "resources": ["modelartifacts"], "verbs": ["list"]}
    admin.create(f"{rbac}/roles", {"metadata": {"name": tenant}, "rules": [rule]})
    admin.create(
        f"{rbac}/rolebindings",
        {
            "metadata": {"name": tenant},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": tenant},
            "subjects": [{"kind": "ServiceAccount", "name": tenant, "namespace": ns}],
        },
    )
    try:
        allowed = manage(str(cluster.kubeconfig), "checkinstall", "--tenant", tenant, "--namespace", ns)
        print(allowed.stdout, allowed.stderr)
        assert allowed.returncode != 0
        assert f"FAIL serviceaccount {ns}/{tenant} may not list modelartifacts" in allowed.stdout
        assert "1 check(s) failed" in allowed.stderr
    finally:
        admin.delete(f"{rbac}/rolebindings/{tenant}")
        admin.delete(f"{rbac}/roles/{tenant}")
        admin.delete(f"/api/v1/namespaces/{ns}/serviceaccounts/{tenant}")


def test_checkinstall_fails_when_the_apiservice_is_unavailable(worker_api, cluster, launcher):
    group = f"t{uuid.uuid4().hex[:8]}.example.com"
    admin = launcher.admin
    admin.create(
        "/apis/apiregistration.k8s.io/v1/apiservices",
        {
            "metadata": {"name": f"v1.{group}"},
            "spec": {
                "group": group,
                "version": "v1",
                "service": {"namespace": "default", "name": "nowhere", "port": 443},
                "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 100,
                "versionPriority": 10,
            },
        },
    )
    try:
        out = manage(str(cluster.kubeconfig), "checkinstall", "--tenant", "default", "--namespace", "default",
                     "--api-service", f"v1.{group}")  # fmt: skip
        print(out.stdout, out.stderr)
        assert out.returncode != 0
        assert f"FAIL APIService v1.{group} is Available" in out.stdout
        assert f"FAIL discovery of {group}/v1" in out.stdout
    finally:
        admin.delete(f"/apis/apiregistration.k8s.io/v1/apiservices/v1.{group}")
