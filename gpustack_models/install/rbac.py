"""The service's namespace, ServiceAccounts and RBAC.

The service: full access to the storage CRDs and their status (the mount protection finalizer of
ModelArtifacts included), read on Nodes and its namespace's Pods, ``get`` on Pods everywhere (a mount
is authorized from its Pod, and ends when the Pod is gone: read by name, never listed or watched), ``get``
on Secrets and claims (read by name when resolving), ``create`` and ``patch`` on Events (what happened to
artifacts and node stores), delegated authentication and authorization, and ``get``, ``create`` and
``update`` on Leases in its own namespace (leader election of the informers and beat).
The plugin: read its NodeModelStore, write its status (its own node only: an admission policy), and
create TokenReviews. Tenants get nothing.
"""

from __future__ import annotations

from django.conf import settings

from gpustack_models.install.common import RBAC, meta, service_account_subject
from gpustack_models.kinds import GROUP, KINDS


def service_accounts() -> list[dict]:
    ns = settings.NAMESPACE
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(settings.SERVICE_ACCOUNT, ns)},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(settings.PLUGIN_SERVICE_ACCOUNT, ns)},
    ]


def namespace_objects() -> list[dict]:
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": meta(settings.NAMESPACE)}, *service_accounts()]


def role(kind: str, name: str, rules: list[dict], namespace: str | None = None) -> dict:
    return {"apiVersion": f"{RBAC}/v1", "kind": kind, "metadata": meta(name, namespace), "rules": rules}


def binding(kind: str, name: str, role_kind: str, role_name: str, subjects: list[dict], namespace=None) -> dict:
    return {
        "apiVersion": f"{RBAC}/v1",
        "kind": kind,
        "metadata": meta(name, namespace),
        "roleRef": {"apiGroup": RBAC, "kind": role_kind, "name": role_name},
        "subjects": subjects,
    }


def service_objects() -> list[dict]:
    plurals = [k.plural for k in KINDS]
    subject = service_account_subject(settings.SERVICE_ACCOUNT)
    # Its roles keep the ServiceAccount's first name, as installed clusters have them.
    name, ns = "gpustack-models-worker", settings.NAMESPACE
    rules = [
        {"apiGroups": [GROUP], "resources": plurals + [f"{p}/status" for p in plurals], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["nodes", "namespaces"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["secrets", "persistentvolumeclaims"], "verbs": ["get"]},
        # The Pod a node plugin asks to mount a model for, and whether it still exists: by name only.
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        # Events about artifacts and node stores (kubectl describe): new ones, and repeats counted on them.
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    own = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        # Tokens of its own ServiceAccount for the plugins' audience (the only token it shows a node).
        {
            "apiGroups": [""],
            "resources": ["serviceaccounts/token"],
            "verbs": ["create"],
            "resourceNames": [settings.SERVICE_ACCOUNT],
        },
        # Leader election of the informers' and beat's replicas (kube.leases): its own namespace's Leases.
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
    ]
    return [
        role("ClusterRole", name, rules),
        binding("ClusterRoleBinding", name, "ClusterRole", name, subject),
        binding("ClusterRoleBinding", f"{name}:auth-delegator", "ClusterRole", "system:auth-delegator", subject),
        binding(
            "RoleBinding",
            f"{name}:authentication-reader",
            "Role",
            "extension-apiserver-authentication-reader",
            subject,
            "kube-system",
        ),
        role("Role", name, own, ns),
        binding("RoleBinding", name, "Role", name, subject, ns),
    ]


def plugin_objects() -> list[dict]:
    subject = service_account_subject(settings.PLUGIN_SERVICE_ACCOUNT)
    name = "gpustack-models-plugin"
    rules = [
        {"apiGroups": [GROUP], "resources": ["nodemodelstores"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [GROUP], "resources": ["nodemodelstores/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    ]
    return [role("ClusterRole", name, rules), binding("ClusterRoleBinding", name, "ClusterRole", name, subject)]


def rbac_objects() -> list[dict]:
    return service_objects() + plugin_objects()
