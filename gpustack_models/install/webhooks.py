"""The placement webhook's registration: a MutatingWebhookConfiguration, and the RBAC that lets its caller
(kube-apiserver, as ``GPUSTACK_PLACEMENT_CALLER``) post to it. In the node-labels mode
(``GPUSTACK_PLACEMENT_MODE=nodeLabels``) the caller needs no right, and the service gets ``get`` and
``patch`` on Nodes (``label_writer_objects``) to write their placement labels; the admission policy
``policies.node_writes_policy`` keeps those writes to the placement labels.

In a cluster the webhook is reached through the API's Service (``deploy/``, the chart fills ``caBundle``);
a local API process outside the cluster is registered by URL with its serving CA.
"""

from __future__ import annotations

import base64

from django.conf import settings

from gpustack_models.install.common import meta, service_account_subject
from gpustack_models.install.rbac import binding, role
from gpustack_models.kube.volumes import MODEL_DRIVER

NAME = "gpustack-models-placement"
PATH = "/internal/v1/placement"
DRIVER = MODEL_DRIVER
# Only Pods with a model volume ever reach the webhook.
MOUNTS_A_MODEL = (
    "has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.csi) && v.csi.driver == '" + DRIVER + "')"
)


def client_config(path: str, url: str | None = None, ca_bundle: bytes | None = None) -> dict:
    """How kube-apiserver reaches the API's ``path``: ``url`` (a local API process) or else its Service."""
    if url:
        client = {"url": url}
    else:
        service = {"namespace": settings.NAMESPACE, "name": settings.API_SERVICE_NAME, "path": path, "port": 443}
        client = {"service": service}
    if ca_bundle:
        client["caBundle"] = base64.b64encode(ca_bundle).decode()
    return client


def pod_create_webhook(name: str, client: dict) -> dict:
    """A webhook on Pod creates that mount a model, failing open within 2 s (the fields both webhooks share)."""
    return {
        "name": name,
        "clientConfig": client,
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "matchConditions": [{"name": "mounts-a-model", "expression": MOUNTS_A_MODEL}],
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "timeoutSeconds": 2,
        "matchPolicy": "Equivalent",
        "admissionReviewVersions": ["v1"],
    }


def placement_webhook(url: str | None = None, ca_bundle: bytes | None = None) -> dict:
    """The configuration, calling ``url`` (a local API process) or else the API's Service."""
    webhook = pod_create_webhook("placement.model.csi.gpustack.ai", client_config(PATH, url, ca_bundle))
    webhook["reinvocationPolicy"] = "Never"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": meta(NAME),
        "webhooks": [webhook],
    }


def caller_objects(name: str = "gpustack-models:placement-caller", path: str = PATH) -> list[dict]:
    """``post`` on the webhook's path for its caller, and nobody else."""
    rules = [{"nonResourceURLs": [path], "verbs": ["post"]}]
    subjects = [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": settings.PLACEMENT_CALLER}]
    return [role("ClusterRole", name, rules), binding("ClusterRoleBinding", name, "ClusterRole", name, subjects)]


LABEL_WRITER = "gpustack-models-worker:placement-labels"


def label_writer_objects() -> list[dict]:
    """The node-labels mode's right: the service reads and patches Nodes (their placement labels only, as
    the admission policy enforces), and nothing else of theirs."""
    rules = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    subjects = service_account_subject(settings.SERVICE_ACCOUNT)
    return [
        role("ClusterRole", LABEL_WRITER, rules),
        binding("ClusterRoleBinding", LABEL_WRITER, "ClusterRole", LABEL_WRITER, subjects),
    ]


def webhook_objects() -> list[dict]:
    """What ``deploy/`` holds: the caller's RBAC and the configuration through the Service."""
    return caller_objects() + [placement_webhook()]
