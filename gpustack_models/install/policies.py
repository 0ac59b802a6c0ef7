"""ValidatingAdmissionPolicies guarding the storage version.

RBAC has no version field, so anyone with write RBAC on the group could reach v1alpha1 directly. Only
the service creates objects or changes spec/status; a node's plugin writes its own NodeModelStore's
status. Metadata-only updates and deletes stay open (the garbage collector and kubectl label rely on
them, and the service's own finalizer on mounted ModelArtifacts is one).
"""

from __future__ import annotations

from gpustack_models.install.common import meta
from gpustack_models.kinds import GROUP, KINDS, PUBLIC_VERSION
from gpustack_models.kube.identity import NODE_NAME_EXTRA, plugin_user, service_user

ADMISSION = "admissionregistration.k8s.io/v1"


def _policy(name: str, operations: list[str], resources: list[str], variables: list[dict], validation: dict) -> dict:
    rule = {"apiGroups": [GROUP], "apiVersions": ["*"], "operations": operations, "resources": resources}
    return {
        "apiVersion": ADMISSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": meta(name),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [rule]},
            "variables": variables,
            "validations": [dict(validation, reason="Forbidden")],
        },
    }


def _is_service() -> dict:
    return {"name": "isService", "expression": f"request.userInfo.username == '{service_user()}'"}


def storage_writes_policy() -> dict:
    """Creates and spec changes: the service's alone."""
    spec_unchanged = {
        "name": "specUnchanged",
        "expression": "request.operation == 'UPDATE' && has(object.spec) == has(oldObject.spec) && "
        "(!has(object.spec) || object.spec == oldObject.spec)",
    }
    validation = {
        "expression": "variables.isService || variables.specUnchanged",
        "messageExpression": "'only the gpustack-models service may ' + "
        "(request.operation == 'CREATE' ? 'create ' : 'change the spec of ') + request.resource.resource + "
        f"'; use {GROUP}/{PUBLIC_VERSION}'",
    }
    plurals = [k.plural for k in KINDS]
    return _policy(
        "gpustack-models-storage-writes", ["CREATE", "UPDATE"], plurals, [_is_service(), spec_unchanged], validation
    )


def status_writes_policy() -> dict:
    """Status changes: the service's, and a NodeModelStore's own node plugin's (its Pod-bound token's node)."""
    own_plugin = {
        "name": "isOwnPlugin",
        "expression": f"request.resource.resource == 'nodemodelstores' && "
        f"request.userInfo.username == '{plugin_user()}' && has(request.userInfo.extra) && "
        f"'{NODE_NAME_EXTRA}' in request.userInfo.extra && "
        f"request.userInfo.extra['{NODE_NAME_EXTRA}'] == [object.metadata.name]",
    }
    status_unchanged = {
        "name": "statusUnchanged",
        "expression": "has(object.status) == has(oldObject.status) && "
        "(!has(object.status) || object.status == oldObject.status)",
    }
    validation = {
        "expression": "variables.isService || variables.isOwnPlugin || variables.statusUnchanged",
        "messageExpression": "'only the gpustack-models service' + "
        "(request.resource.resource == 'nodemodelstores' ? ' and the node\\'s own plugin' : '') + "
        "' may write the status of ' + request.resource.resource",
    }
    resources = [f"{k.plural}/status" for k in KINDS]
    variables = [_is_service(), own_plugin, status_unchanged]
    return _policy("gpustack-models-status-writes", ["UPDATE"], resources, variables, validation)


def policy_objects() -> list[dict]:
    policies = [storage_writes_policy(), status_writes_policy()]
    bindings = [
        {
            "apiVersion": ADMISSION,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": meta(policy["metadata"]["name"]),
            "spec": {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]},
        }
        for policy in policies
    ]
    return policies + bindings
