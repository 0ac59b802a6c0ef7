"""The cluster objects the service needs besides the CRDs: namespace, ServiceAccounts, RBAC, the
admission policies guarding the storage version, and the aggregation (Service + APIService).

``python manage.py writemanifests`` writes the static ones to ``deploy/``; the local launcher and the
test fixtures apply them, plus the APIService for the local worker with its serving CA.
"""

from __future__ import annotations

import base64
from pathlib import Path

import yaml
from django.conf import settings

from .resources.crd import HEADER
from .resources.kinds import GROUP, KINDS, PUBLIC_VERSION

DEPLOY_DIR = Path(__file__).resolve().parent.parent / "deploy"
LABELS = {"app.kubernetes.io/part-of": "gpustack-models"}
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def sa_user(name: str) -> str:
    return f"system:serviceaccount:{settings.NAMESPACE}:{name}"


def _meta(name: str, namespace: str | None = None) -> dict:
    meta = {"name": name, "labels": dict(LABELS)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def namespace_objects() -> list[dict]:
    ns = settings.NAMESPACE
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(ns)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(settings.WORKER_SERVICE_ACCOUNT, ns)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(settings.PLUGIN_SERVICE_ACCOUNT, ns)},
    ]


def rbac_objects() -> list[dict]:
    ns, worker, plugin = settings.NAMESPACE, settings.WORKER_SERVICE_ACCOUNT, settings.PLUGIN_SERVICE_ACCOUNT
    plurals = [k.plural for k in KINDS]
    worker_subject = [{"kind": "ServiceAccount", "name": worker, "namespace": ns}]
    plugin_subject = [{"kind": "ServiceAccount", "name": plugin, "namespace": ns}]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta("gpustack-models-worker"),
            "rules": [
                {"apiGroups": [GROUP], "resources": plurals + [f"{p}/status" for p in plurals], "verbs": ["*"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["secrets", "persistentvolumeclaims"], "verbs": ["get"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta("gpustack-models-worker"),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gpustack-models-worker",
            },
            "subjects": worker_subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta("gpustack-models-worker:auth-delegator"),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": worker_subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta("gpustack-models-worker:authentication-reader", "kube-system"),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": worker_subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta("gpustack-models-worker", ns),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta("gpustack-models-worker", ns),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpustack-models-worker"},
            "subjects": worker_subject,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": _meta("gpustack-models-plugin"),
            "rules": [
                {"apiGroups": [GROUP], "resources": ["nodemodelstores"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [GROUP], "resources": ["nodemodelstores/status"], "verbs": ["get", "patch", "update"]},
                {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": _meta("gpustack-models-plugin"),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gpustack-models-plugin",
            },
            "subjects": plugin_subject,
        },
    ]


def policy_objects() -> list[dict]:
    """ValidatingAdmissionPolicies: RBAC has no version field, so anyone with write RBAC on the group could
    reach v1alpha1 directly. Only the worker creates objects or changes spec/status; a node's plugin
    writes its own NodeModelStore's status. Metadata-only updates and deletes stay open (the garbage
    collector and kubectl label rely on them)."""
    worker = sa_user(settings.WORKER_SERVICE_ACCOUNT)
    plugin = sa_user(settings.PLUGIN_SERVICE_ACCOUNT)
    plurals = [k.plural for k in KINDS]
    is_worker = {"name": "isWorker", "expression": f"request.userInfo.username == '{worker}'"}
    storage = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta("gpustack-models-storage-writes"),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": plurals,
                    }
                ]
            },
            "variables": [
                is_worker,
                {
                    "name": "specUnchanged",
                    "expression": "request.operation == 'UPDATE' && has(object.spec) == has(oldObject.spec) && "
                    "(!has(object.spec) || object.spec == oldObject.spec)",
                },
            ],
            "validations": [
                {
                    "expression": "variables.isWorker || variables.specUnchanged",
                    "messageExpression": "'only the gpustack-models worker may ' + "
                    "(request.operation == 'CREATE' ? 'create ' : 'change the spec of ') + request.resource.resource + "
                    f"'; use {GROUP}/{PUBLIC_VERSION}'",
                    "reason": "Forbidden",
                }
            ],
        },
    }
    status = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _meta("gpustack-models-status-writes"),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        "resources": [f"{p}/status" for p in plurals],
                    }
                ]
            },
            "variables": [
                is_worker,
                {
                    "name": "isOwnPlugin",
                    "expression": f"request.resource.resource == 'nodemodelstores' && "
                    f"request.userInfo.username == '{plugin}' && has(request.userInfo.extra) && "
                    f"'{NODE_NAME_EXTRA}' in request.userInfo.extra && "
                    f"request.userInfo.extra['{NODE_NAME_EXTRA}'] == [object.metadata.name]",
                },
                {
                    "name": "statusUnchanged",
                    "expression": "has(object.status) == has(oldObject.status) && "
                    "(!has(object.status) || object.status == oldObject.status)",
                },
            ],
            "validations": [
                {
                    "expression": "variables.isWorker || variables.isOwnPlugin || variables.statusUnchanged",
                    "messageExpression": "'only the gpustack-models worker' + "
                    "(request.resource.resource == 'nodemodelstores' ? ' and the node\\'s own plugin' : '') + "
                    "' may write the status of ' + request.resource.resource",
                    "reason": "Forbidden",
                }
            ],
        },
    }
    bindings = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": _meta(policy["metadata"]["name"]),
            "spec": {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]},
        }
        for policy in (storage, status)
    ]
    return [storage, status] + bindings


def api_service(ca_bundle: bytes, port: int) -> list[dict]:
    """The Service and APIService that route ``worker.gpustack.ai/v1`` to the worker.

    For a worker outside the cluster (local runs, tests) the Service is an ExternalName ``localhost``:
    EndpointSlices refuse loopback addresses, and kube-apiserver dials ``<externalName>:<port>``.
    """
    name, ns = settings.API_SERVICE_NAME, settings.NAMESPACE
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(name, ns),
            "spec": {
                "type": "ExternalName",
                "externalName": "localhost",
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": _meta(f"{PUBLIC_VERSION}.{GROUP}"),
            "spec": {
                "group": GROUP,
                "version": PUBLIC_VERSION,
                "groupPriorityMinimum": 1000,
                "versionPriority": 200,
                "service": {"namespace": ns, "name": name, "port": port},
                "caBundle": base64.b64encode(ca_bundle).decode(),
            },
        },
    ]


def serving_names() -> list[str]:
    name, ns = settings.API_SERVICE_NAME, settings.NAMESPACE
    return [f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}", "localhost"]


# --- deploy/ -------------------------------------------------------------------------------------------


def manifest_files() -> dict[Path, str]:
    def render(objects):
        return HEADER + yaml.safe_dump_all(objects, sort_keys=False, width=100)

    return {
        DEPLOY_DIR / "worker" / "namespace.yaml": render(namespace_objects()),
        DEPLOY_DIR / "worker" / "rbac.yaml": render(rbac_objects()),
        DEPLOY_DIR / "worker" / "admission-policies.yaml": render(policy_objects()),
    }


def deploy_files() -> dict[Path, str]:
    """Everything under deploy/ that is generated: the CRDs and the files above."""
    from .resources.crd import crd_files

    return {**crd_files(), **manifest_files()}


def stale_files() -> list[Path]:
    return [path for path, text in deploy_files().items() if not path.exists() or path.read_text() != text]
