"""The service's namespace, ServiceAccounts and RBAC.

The service: full access to the storage CRDs and their status (the mount protection finalizer of
ModelArtifacts included), read on Nodes and its namespace's Pods, ``get`` on Pods everywhere (a mount
is authorized from its Pod, and ends when the Pod is gone: read by name, never listed or watched), ``get``
on Secrets and claims (read by name when resolving), ``create`` and ``patch`` on Events (what happened to
artifacts and node stores), delegated authentication and authorization, and ``get``, ``create`` and
``update`` on Leases in its own namespace (leader election of the informers and beat), and the one
ConfigMap of the CA certificates nodes trust (``GPUSTACK_CA_CONFIGMAP``, ``CA_CONFIGMAP`` by default) there.
No token of its own is ever requested for a node. The plugin: read its NodeModelStore and write its status
(its own node only: an admission policy); its callers present client certificates, so it reviews no token.

Tenants get nothing by themselves: two ClusterRoles are ready for an administrator to bind in a tenant's
namespace with a RoleBinding (``tenant_objects``): ``gpustack-models-tenant-reader`` (read the namespaced kinds,
their subresources such as ``progress``, and the namespace's Events, as ``kubectl describe`` shows them) and
``gpustack-models-tenant-editor`` (that, plus create, change and delete them; never their status, never the
cluster-scoped NodeModelStores).
"""

from __future__ import annotations

from django.conf import settings

from gpustack_models.install.common import RBAC, meta, service_account_subject
from gpustack_models.kinds import GROUP, KINDS

CA_CONFIGMAP = "gpustack-models-ca"  # the chart's name of the CA ConfigMap


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


def ca_configmap_rules() -> list[dict]:
    """The CA certificates nodes trust, published when cert-manager issues the API's (``GPUSTACK_CA_CONFIGMAP``):
    that one ConfigMap (``create`` cannot be limited to a name)."""
    return [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "update", "patch"],
            "resourceNames": [settings.CA_CONFIGMAP or CA_CONFIGMAP],
        },
    ]


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
        *ca_configmap_rules(),
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
    ]
    return [role("ClusterRole", name, rules), binding("ClusterRoleBinding", name, "ClusterRole", name, subject)]


TENANT_READER = "gpustack-models-tenant-reader"
TENANT_EDITOR = "gpustack-models-tenant-editor"
READ = ["get", "list", "watch"]
WRITE = ["create", "update", "patch", "delete", "deletecollection"]


def tenant_objects() -> list[dict]:
    """The tenant roles (bound by nobody here): ClusterRoles so one definition serves every namespace a
    RoleBinding names."""
    plurals = [k.plural for k in KINDS if k.namespaced]
    subresources = [f"{k.plural}/{name}" for k in KINDS if k.namespaced for name, _kind, _verbs in k.subresources]

    def reader() -> list[dict]:  # fresh lists each time: no shared objects (YAML anchors) in the manifests
        return [
            {"apiGroups": [GROUP], "resources": plurals + subresources, "verbs": list(READ)},
            {"apiGroups": [""], "resources": ["events"], "verbs": list(READ)},
        ]

    editor = [*reader(), {"apiGroups": [GROUP], "resources": list(plurals), "verbs": list(WRITE)}]
    return [role("ClusterRole", TENANT_READER, reader()), role("ClusterRole", TENANT_EDITOR, editor)]


def rbac_objects() -> list[dict]:
    return service_objects() + plugin_objects() + tenant_objects()
