"""Nodes and their plugin Pods written as a kubelet would report them, where no kubelet runs Pods (local
runs, tests): the service reads these objects exactly as in a cluster.
"""

from __future__ import annotations

import time

from django.conf import settings

from gpustack_models import kube

PLUGIN_LABELS = {"app.kubernetes.io/name": "gpustack-models-plugin"}


def kubelet_labels(node: str) -> dict:
    """The labels a kubelet puts on its Node, so selectors written for a cluster select local nodes too."""
    return {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}


class LocalNodes:
    """The Nodes and plugin Pods of a cluster written through ``admin`` (admin credentials)."""

    def __init__(self, admin: kube.Kube):
        self.admin = admin

    def plugin_pod_name(self, node: str) -> str:
        return f"gpustack-models-plugin-{node}"[:253]

    def register_node(self, node: str, plugin_ip: str, labels: dict | None = None) -> dict:
        """Create ``node`` (Ready) and its plugin Pod, bound to it and Running at ``plugin_ip``.

        Where no kubelet runs Pods (local runs, tests) this is what the kubelet and the DaemonSet
        controller would have written; the service reads these objects exactly as in a cluster."""
        self.ready_node(node, plugin_ip, labels)
        created = self.create_or_get(f"/api/v1/namespaces/{settings.NAMESPACE}/pods", self.plugin_pod(node))
        self.set_plugin_ready(node, plugin_ip, True, pod=created)
        return created

    def create_or_get(self, collection: str, obj: dict) -> dict:
        try:
            return self.admin.create(collection, obj)
        except kube.Conflict:
            return self.admin.get(f"{collection}/{obj['metadata']['name']}")

    def ready_node(self, node: str, address: str, labels: dict | None) -> None:
        node_obj = self.create_or_get(
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": {**kubelet_labels(node), **(labels or {})}},
            },
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "local"}
        node_obj["status"] = {
            "conditions": [dict(ready, lastHeartbeatTime=now, lastTransitionTime=now)],
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": node}],
        }
        self.admin.json("PUT", f"/api/v1/nodes/{node}/status", body=node_obj)

    def plugin_pod(self, node: str) -> dict:
        container = {
            "name": "plugin",
            "image": "gpustack/gpustack-models:local",
            "command": ["python", "-m", "gpustack_models.plugin", f"--node={node}"],
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.plugin_pod_name(node), "labels": dict(PLUGIN_LABELS)},
            "spec": {
                "nodeName": node,
                "serviceAccountName": settings.PLUGIN_SERVICE_ACCOUNT,
                "containers": [container],
            },
        }

    def set_plugin_ready(self, node: str, plugin_ip: str, ready: bool, pod: dict | None = None) -> None:
        path = f"/api/v1/namespaces/{settings.NAMESPACE}/pods/{self.plugin_pod_name(node)}"
        pod = pod or self.admin.get(path)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        state = "True" if ready else "False"
        pod["status"] = {
            "phase": "Running",
            "podIP": plugin_ip,
            "podIPs": [{"ip": plugin_ip}],
            "hostIP": plugin_ip,
            "startTime": now,
            "conditions": [
                {"type": t, "status": state, "lastTransitionTime": now}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
        }
        self.admin.json("PUT", f"{path}/status", body=pod)

    def unregister_node(self, node: str) -> None:
        for path in (
            f"/api/v1/namespaces/{settings.NAMESPACE}/pods/{self.plugin_pod_name(node)}",
            f"/api/v1/nodes/{node}",
        ):
            try:
                self.admin.delete(path, query={"gracePeriodSeconds": "0"})
            except kube.NotFound:
                pass
