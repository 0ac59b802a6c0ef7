"""The chart's release on the real node (``chart_release``, tests/support/release.py): ``helm test`` passes on
it; draining the node keeps the APIService available, the API's PodDisruptionBudget refusing the second
API Pod's eviction; ``helm uninstall`` of the release while a Pod mounts a model and a ModelPrefetch holds it,
then deleting the tenant's namespace, finishes within a minute (the pre-delete hook removes the product's
finalizers), and installing again brings the release back. One release serves the three tests, in this
order (the last uninstalls and installs it again)."""

from __future__ import annotations

import os
import threading
import time
import uuid

from gpustack_models import kube
from gpustack_models.kinds import GROUP, PUBLIC_VERSION
from gpustack_models.models import MOUNT_PROTECTION
from tests.support import wait_for
from tests.support.kubernetes import wait_default_service_account
from tests.support.release import NAMESPACE, RELEASE
from tests.test_delivery import consumer, pod_ready, resolved_digest

APISERVICE = f"/apis/apiregistration.k8s.io/v1/apiservices/{PUBLIC_VERSION}.{GROUP}"
API_PODS = "app.kubernetes.io/name=gpustack-models-api"
BUDGET_REFUSAL = "Cannot evict pod as it would violate the pod's disruption budget"


def test_helm_test_passes_on_the_installed_release(chart_release):
    answer = chart_release.helm("test", RELEASE, "--namespace", NAMESPACE, "--logs", "--timeout", "120s", check=False)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert "checkinstall: every check passed" in answer.stdout, answer.stdout


class Availability:
    """Polls in a thread, until closed, what every kubectl needs through kube-apiserver: the APIService's
    Available condition, the group's discovery and a list of ModelArtifacts; keeps every failure."""

    def __init__(self, admin: kube.Kube):
        self.admin = admin
        self.failures: list[str] = []
        self.polls = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self) -> None:
        conditions = {c["type"]: c for c in self.admin.get(APISERVICE).get("status", {}).get("conditions", [])}
        available = conditions.get("Available", {})
        if available.get("status") != "True":
            self.failures.append(f"Available {available.get('status')}: {available.get('message')}")
        self.admin.get(f"/apis/{GROUP}/{PUBLIC_VERSION}")
        self.admin.get(f"/apis/{GROUP}/{PUBLIC_VERSION}/modelartifacts")

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._poll()
            except Exception as exc:  # every failure is the finding
                self.failures.append(repr(exc))
            self.polls += 1
            self.stop.wait(0.2)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def api_pods(admin: kube.Kube) -> dict[str, dict]:
    """The API's Pods not being deleted, by uid."""
    pods = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods", query={"labelSelector": API_PODS})["items"]
    return {p["metadata"]["uid"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def api_budget(admin: kube.Kube) -> dict:
    """The API's PodDisruptionBudget as the disruption controller keeps it ({} if the chart rendered none)."""
    try:
        return admin.get(f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/gpustack-models-api")
    except kube.NotFound:
        return {}


def test_draining_the_apis_node_keeps_the_apiservice_available_as_the_budget_refuses_the_second_eviction(
    chart_release, real_node
):
    admin = chart_release.admin
    before = api_pods(admin)
    assert len(before) == 2 and all(pod_ready(admin, NAMESPACE, p["metadata"]["name"]) for p in before.values())
    drain = ["drain", real_node.name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=10s",
             f"--pod-selector=app.kubernetes.io/instance={RELEASE}"]  # fmt: skip
    t0 = time.monotonic()
    with Availability(admin) as availability:
        try:
            drained = real_node.kubectl(*drain, check=False)
            budget = api_budget(admin)
            during = api_pods(admin)
        finally:
            real_node.kubectl("uncordon", real_node.name)
        chart_release.wait_healthy()
        after = api_pods(admin)
    print(f"[drain] {time.monotonic() - t0:.1f}s, {availability.polls} polls of the APIService")
    output = drained.stdout + drained.stderr
    # The APIService never went unavailable, and every request through kube-apiserver was answered.
    assert availability.failures == [] and availability.polls >= 20, (availability.polls, availability.failures)
    # One API Pod was evicted, the other stayed: the budget refused its eviction until drain gave up.
    assert drained.returncode != 0, output
    assert len(set(before) & set(during)) == 1, output
    (kept,) = (before[uid]["metadata"]["name"] for uid in set(before) & set(during))
    (evicted,) = (before[uid]["metadata"]["name"] for uid in set(before) - set(during))
    assert f"pod/{evicted} evicted" in output, output
    refusals = [line for line in output.splitlines() if kept in line and BUDGET_REFUSAL in line]
    assert refusals, output
    assert budget["status"]["disruptionsAllowed"] == 0 and budget["status"]["currentHealthy"] == 1, budget["status"]
    # Once uncordoned, the replacement became Ready beside the Pod that stayed.
    assert len(after) == 2 and set(before) & set(after) == set(before) & set(during)


def mount_and_prefetch(admin: kube.Kube, real_node, hub, tenant: str) -> None:
    """A model a Pod on the node mounts (so the API put its mount protection on the artifact) and a
    ModelPrefetch holds on the node."""
    repo = f"org/release-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {"config.json": b"{}", "model.safetensors": os.urandom(256 * 1024)})
    public = f"/apis/{GROUP}/{PUBLIC_VERSION}/namespaces/{tenant}"
    spec = {"source": {"huggingFace": {"repository": repo}}}
    version = f"{GROUP}/{PUBLIC_VERSION}"
    body = {"apiVersion": version, "kind": "ModelArtifact", "metadata": {"name": "qwen"}, "spec": spec}
    admin.create(f"{public}/modelartifacts", body)
    wait_for(lambda: resolved_digest(admin, tenant, "qwen"), timeout=60, message="the artifact resolved")
    prefetch = {"artifactRef": {"name": "qwen"}, "nodeNames": [real_node.name]}
    body = {"apiVersion": version, "kind": "ModelPrefetch", "metadata": {"name": "warm"}, "spec": prefetch}
    admin.create(f"{public}/modelprefetches", body)
    admin.create(f"/api/v1/namespaces/{tenant}/pods", consumer(real_node, "app", "qwen", "sleep 3600"))
    wait_for(lambda: pod_ready(admin, tenant, "app"), timeout=180, message="the mounting Pod to start")
    stored = admin.get(f"/apis/{GROUP}/v1alpha1/namespaces/{tenant}/modelartifacts/qwen")
    assert MOUNT_PROTECTION in stored["metadata"].get("finalizers", []), stored["metadata"]


def namespace_gone(admin: kube.Kube, name: str) -> bool:
    try:
        admin.get(f"/api/v1/namespaces/{name}")
    except kube.NotFound:
        return True
    return False


def test_uninstalling_with_a_mounted_and_prefetched_model_frees_the_tenant_namespace_in_a_minute_and_reinstalls(
    chart_release, real_node, hub
):
    admin = chart_release.admin
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": tenant}})
    wait_default_service_account(admin, tenant)
    mount_and_prefetch(admin, real_node, hub, tenant)

    t0 = time.monotonic()
    uninstalled = chart_release.uninstall()
    assert f'release "{RELEASE}" uninstalled' in uninstalled.stdout, uninstalled.stdout
    admin.delete(f"/api/v1/namespaces/{tenant}")
    # Both within a minute: the uninstall (its hook included) and the tenant namespace's deletion.
    left = 60 - (time.monotonic() - t0)
    wait_for(lambda: namespace_gone(admin, tenant), timeout=left, message="the tenant namespace to be deleted")
    print(f"[uninstall] helm uninstall and the namespace's deletion: {time.monotonic() - t0:.1f}s")

    seconds = chart_release.install()  # healthy again: every role and the APIService available
    print(f"[reinstall] healthy in {seconds:.1f}s")
