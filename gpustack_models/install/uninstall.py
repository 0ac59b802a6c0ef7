"""Leaving a cluster healthy after ``helm uninstall`` (``manage.py uninstall``, the chart's pre-delete hook).

Once the release's controllers are gone nothing lifts the finalizers the product put on its storage objects,
so deleting a tenant namespace (or the CRDs) would hang on them. In order:

1. ``mark_plugins``: annotate every plugin Pod of the release ``worker.gpustack.ai/uninstalling: "true"``. The
   plugin reads its own annotations from a downwardAPI volume; on SIGTERM a marked plugin keeps serving
   NodeUnpublish until its node has no publication left, so Pods still mounting a model can terminate after
   the DaemonSet is deleted (the kubelet needs the driver to tear a CSI volume down). Marked first, so the
   kubelet has refreshed the volume by the time Helm deletes the DaemonSet.
2. ``stop_controllers``: scale the release's API, informers, worker and beat Deployments to 0 and wait until
   their Pods are gone: none of them re-adds a finalizer afterwards (the API adds the mount protection on a
   mount, the worker lifts and reconciles it).
3. ``delete_test_pod``: the ``helm test`` Pod Helm keeps for ``helm test --logs`` and never deletes.
4. ``release_finalizers``: remove the product's finalizers from every object of the storage kinds in every
   namespace, by a merge patch of ``metadata.finalizers`` conditioned on the resourceVersion read (the
   admission policies leave metadata-only updates open), so no other finalizer is lost.

Each step is idempotent; the command can be run again after a failure, or by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from gpustack_models import kube
from gpustack_models.kinds import KINDS, ResourceKind
from gpustack_models.kinds.base import GROUP, STORAGE_VERSION
from gpustack_models.models import MOUNT_PROTECTION

OWNED_FINALIZERS = (MOUNT_PROTECTION,)  # every finalizer the product adds
UNINSTALLING = f"{GROUP}/uninstalling"  # the plugin Pods' annotation (plugin.csi.uninstall reads it)
CONTROLLERS = ("api", "informers", "worker", "beat")  # app.kubernetes.io/component of the release's Deployments
PLUGIN = "gpustack-models-plugin"  # app.kubernetes.io/name of the plugin's Pods
TEST_POD = "gpustack-models-test"  # the `helm test` Pod, which Helm leaves behind for its logs
STORAGE = f"/apis/{GROUP}/{STORAGE_VERSION}"
MERGE_PATCH = "application/merge-patch+json"
PAGE = 500

Say = Callable[[str], None]


class UninstallError(Exception):
    """A step did not finish; the message says which and why."""


def listing(client: kube.Kube, path: str, selector: str = "") -> Iterator[dict]:
    """Every item of the list at ``path``, page by page."""
    query = {"limit": str(PAGE), **({"labelSelector": selector} if selector else {})}
    while True:
        page = client.get(path, query=query)
        yield from page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return
        query["continue"] = token


def release_selector(release: str, label: str, values: tuple[str, ...]) -> str:
    return f"app.kubernetes.io/instance={release},{label} in ({','.join(values)})"


def mark_plugins(client: kube.Kube, namespace: str, release: str, say: Say) -> int:
    """Annotate the release's plugin Pods as uninstalling; returns how many."""
    selector = release_selector(release, "app.kubernetes.io/name", (PLUGIN,))
    marked = 0
    for pod in listing(client, f"/api/v1/namespaces/{namespace}/pods", selector):
        name = pod["metadata"]["name"]
        patch = {"metadata": {"annotations": {UNINSTALLING: "true"}}}
        try:
            client.json("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", body=patch, content_type=MERGE_PATCH)
        except kube.NotFound:
            continue
        marked += 1
    say(f"plugin Pods marked as uninstalling: {marked}")
    return marked


def stop_controllers(client: kube.Kube, namespace: str, release: str, timeout: float, say: Say) -> int:
    """Scale the release's controllers to 0 and wait until their Pods are gone; returns how many Deployments."""
    selector = release_selector(release, "app.kubernetes.io/component", CONTROLLERS)
    deployments = list(listing(client, f"/apis/apps/v1/namespaces/{namespace}/deployments", selector))
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"
        client.json("PATCH", path, body={"spec": {"replicas": 0}}, content_type=MERGE_PATCH)
        say(f"scaled deployment {name} to 0")
    deadline = time.monotonic() + timeout
    while True:
        pods = [p["metadata"]["name"] for p in listing(client, f"/api/v1/namespaces/{namespace}/pods", selector)]
        if not pods:
            say(f"controllers stopped: {len(deployments)} deployments, no Pod left")
            return len(deployments)
        if time.monotonic() >= deadline:
            raise UninstallError(f"controller Pods still running after {timeout:.0f}s: {', '.join(sorted(pods))}")
        say(f"waiting for {len(pods)} controller Pods to stop")
        time.sleep(2)


def delete_test_pod(client: kube.Kube, namespace: str, say: Say) -> None:
    try:
        client.delete(f"/api/v1/namespaces/{namespace}/pods/{TEST_POD}")
        say(f"deleted the test Pod {TEST_POD}")
    except kube.NotFound:
        pass


def object_path(kind: ResourceKind, meta: dict) -> str:
    if kind.namespaced:
        return f"{STORAGE}/namespaces/{meta['namespace']}/{kind.plural}/{meta['name']}"
    return f"{STORAGE}/{kind.plural}/{meta['name']}"


def release_object(client: kube.Kube, kind: ResourceKind, obj: dict, attempts: int = 10) -> bool:
    """Remove the product's finalizers from ``obj`` (read again on a conflict); True if any was removed."""
    path = object_path(kind, obj["metadata"])
    for _ in range(attempts):
        meta = obj["metadata"]
        finalizers = meta.get("finalizers") or []
        kept = [f for f in finalizers if f not in OWNED_FINALIZERS]
        if kept == finalizers:
            return False
        patch = {"metadata": {"finalizers": kept, "resourceVersion": meta["resourceVersion"]}}
        try:
            client.json("PATCH", path, body=patch, content_type=MERGE_PATCH)
            return True
        except kube.NotFound:
            return False
        except kube.Conflict:
            try:
                obj = client.get(path)
            except kube.NotFound:
                return False
    raise UninstallError(f"{path}: still changing after {attempts} attempts to remove its finalizers")


def release_finalizers(client: kube.Kube, say: Say) -> dict[str, int]:
    """Remove the product's finalizers from every object of the storage kinds; returns the count per kind."""
    counts = {}
    for kind in KINDS:
        seen = released = 0
        try:
            for obj in listing(client, f"{STORAGE}/{kind.plural}"):
                seen += 1
                released += release_object(client, kind, obj)
        except kube.NotFound:  # the CRD is gone: nothing of this kind holds a finalizer
            pass
        counts[kind.plural] = released
        say(f"{kind.plural}: finalizers removed from {released} of {seen}")
    return counts


def uninstall(client: kube.Kube, namespace: str, release: str, timeout: float, say: Say) -> None:
    mark_plugins(client, namespace, release, say)
    stop_controllers(client, namespace, release, timeout, say)
    delete_test_pod(client, namespace, say)
    release_finalizers(client, say)
