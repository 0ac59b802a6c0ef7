"""The mount endpoint as a node plugin calls it: two fresh nodes with their plugins' Pod-bound tokens (no
plugin process), Pods with the model volumes a tenant writes (bound to a node: no kubelet runs them, they
stay Pending, which is all authorization needs), and requests naming a volume by the id the kubelet would
give it. The fixture ``mounts``, and the checks its tests share."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pytest
import requests
import yaml
from django.db import connections

from gpustack_models import kube
from gpustack_models.kinds import GROUP
from gpustack_models.models import MountReference
from tests.support.kubernetes import wait_default_service_account
from tests.support.pods import handle, model_pod, model_volume
from tests.support.stores import reconciled, store
from tests.support.waiting import wait_for

STORAGE = f"/apis/{GROUP}/v1alpha1"
_addresses = iter(range(10, 250))


def bound_token(launcher, node: str) -> str:
    """The plugin's Pod-bound token for ``node``, as the DaemonSet's projected token would be."""
    return yaml.safe_load(launcher.plugin_kubeconfig(node).read_text())["users"][0]["user"]["token"]


@dataclass
class Mounts:
    """Two nodes with their plugins' bound tokens (no plugin process), Pods, and the mount endpoint."""

    api: object
    launcher: object
    kube: kube.Kube
    ns: str
    artifact: str
    digest: str
    nodes: list[str]
    tokens: dict[str, str] = field(default_factory=dict)
    pods: list[tuple[str, str]] = field(default_factory=list)

    @property
    def node(self) -> str:
        return self.nodes[0]

    def post(self, body, token: str | None = "", path: str = "mounts", **kwargs) -> requests.Response:
        """POST to the worker as the first node's plugin (``token``: another one; None: none)."""
        session = requests.Session()
        session.trust_env = False
        token = self.tokens[self.node] if token == "" else token
        headers = dict(kwargs.pop("headers", {}), **({"Authorization": f"Bearer {token}"} if token else {}))
        if body is not None:
            kwargs["json"] = body
        return session.post(
            f"{self.api.url}/internal/v1/{path}", headers=headers, verify=str(self.api.ca_file), timeout=30, **kwargs
        )

    def release(self, volume_id: str, node: str | None = None, token: str | None = "") -> requests.Response:
        return self.post({"node": node or self.node, "volumeId": volume_id}, token=token, path="mounts/release")

    def pod(self, name=None, node=None, ns=None, volumes: list[dict] | None = None, **meta) -> dict:
        """A Pod on ``node`` (default: the first) with ``volumes`` (default: one ``model`` volume of the
        artifact)."""
        ns = ns or self.ns
        wait_default_service_account(self.launcher.admin, ns)
        volumes = [model_volume("model", self.artifact)] if volumes is None else volumes
        body = model_pod(name or f"server-{uuid.uuid4().hex[:6]}", node or self.node, volumes, **meta)
        created = self.launcher.admin.create(f"/api/v1/namespaces/{ns}/pods", body)
        self.pods.append((ns, created["metadata"]["name"]))
        return created

    def delete_pod(self, pod: dict) -> None:
        meta = pod["metadata"]
        try:
            self.launcher.admin.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", query={"gracePeriodSeconds": "0"}
            )
        except kube.NotFound:
            pass

    def body(self, pod: dict, artifact=None, node=None, volume: str = "model", **extra) -> dict:
        """The plugin's request for ``pod``'s volume ``volume``, as the kubelet publishes it."""
        meta = pod["metadata"]
        return {
            "node": node or self.node,
            "volumeId": handle(pod, volume),
            "pod": {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]},
            "artifact": artifact or self.artifact,
            "expectedDigest": None,
            **extra,
        }

    def models(self, node: str | None = None) -> list[dict]:
        return ((store(self.kube, node or self.node) or {}).get("spec") or {}).get("models") or []

    def item(self, digest: str, node: str | None = None) -> dict | None:
        return next((m for m in self.models(node) if m["digest"] == digest), None)

    def artifact_object(self, name: str | None = None, ns: str | None = None) -> dict | None:
        try:
            return self.kube.get(f"{STORAGE}/namespaces/{ns or self.ns}/modelartifacts/{name or self.artifact}")
        except kube.NotFound:
            return None

    def finalizers(self, name: str | None = None, ns: str | None = None) -> list[str]:
        return ((self.artifact_object(name, ns) or {}).get("metadata") or {}).get("finalizers") or []

    def reconciled(self, node: str | None = None) -> list[dict]:
        """spec.models of ``node`` as a reconcile started now decides it."""
        return (reconciled(self.launcher.admin, self.kube, node or self.node).get("spec") or {}).get("models") or []


@pytest.fixture
def mounts(worker_stack, worker_api, launcher, worker_kube, namespace, resolved, mirror_db):
    name, digest = resolved
    nodes = [f"m-{uuid.uuid4().hex[:6]}-{i}" for i in range(2)]
    for node in nodes:
        launcher.register_node(node, f"127.0.5.{next(_addresses)}")
    m = Mounts(worker_api, launcher, worker_kube, namespace, name, digest, nodes)
    m.tokens = {node: bound_token(launcher, node) for node in nodes}
    for node in nodes:
        wait_for(lambda node=node: store(worker_kube, node), message=f"the store of {node}")
    yield m
    for ns, pod in m.pods:
        m.delete_pod({"metadata": {"namespace": ns, "name": pod}})
    for node in nodes:
        launcher.unregister_node(node)


def rows(**filters) -> list[MountReference]:
    return list(MountReference.objects.filter(**filters))


def insert_row(**values) -> None:
    """Write a ``MountReference`` as the API once could, on a connection of its own that commits at once (the
    test's connection may be inside a transaction the worker does not see)."""
    values = dict(values, size_bytes=values.get("size_bytes", 0))
    table = MountReference._meta.db_table
    columns = ", ".join([*values, "created_at", "last_seen"])
    connection = connections.create_connection("default")
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(values))}, now(), now())",
                list(values.values()),
            )
    finally:
        connection.close()


def assert_refused(resp: requests.Response, code: int, message: str) -> None:
    assert resp.status_code == code, (code, resp.status_code, resp.text)
    status = resp.json()
    assert status["kind"] == "Status" and status["code"] == code, status
    assert message in status["message"], (message, status["message"])
