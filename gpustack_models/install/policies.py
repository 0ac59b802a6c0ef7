"""ValidatingAdmissionPolicies guarding the storage version, and Nodes against the service.

RBAC has no version field, so anyone with write RBAC on the group could reach v1alpha1 directly. Only
the service creates objects or changes spec/status; a node's plugin writes its own NodeModelStore's
status. Metadata-only updates and deletes stay open (the garbage collector and kubectl label rely on
them, and the service's own finalizer on mounted ModelArtifacts is one). The service, which may patch
Nodes in the node-labels placement mode, changes only their placement labels. A Pod's model volumes are
checked at its creation (``volume_checks.model_volumes_policy``).
"""

from __future__ import annotations

from gpustack_models.install.common import meta
from gpustack_models.install.volume_checks import model_volumes_policy
from gpustack_models.kinds import GROUP, KINDS, PUBLIC_VERSION
from gpustack_models.kinds.placement_labels import LABEL_PREFIX
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


def node_writes_policy() -> dict:
    """The service's writes to Nodes (the node-labels mode's placement labels): they change those labels
    and nothing else (no other label, annotation, owner, finalizer, taint or any of the spec)."""
    prefix = LABEL_PREFIX + "/"
    variables = [
        {"name": "new", "expression": "has(object.metadata.labels) ? object.metadata.labels : {}"},
        {"name": "old", "expression": "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"},
        {"name": "newOther", "expression": f"variables.new.filter(k, !k.startsWith('{prefix}'))"},
        {"name": "oldOther", "expression": f"variables.old.filter(k, !k.startsWith('{prefix}'))"},
    ]
    same = [
        "size(variables.newOther) == size(variables.oldOther)",
        "variables.newOther.all(k, k in variables.old && variables.old[k] == variables.new[k])",
        "object.spec == oldObject.spec",
    ] + [
        f"(has(object.metadata.{field}) ? object.metadata.{field} : {empty}) == "
        f"(has(oldObject.metadata.{field}) ? oldObject.metadata.{field} : {empty})"
        for field, empty in (("annotations", "{}"), ("ownerReferences", "[]"), ("finalizers", "[]"))
    ]
    validation = {
        "expression": " && ".join(same),
        "message": f"the gpustack-models service may change only the {prefix}* labels of Nodes",
    }
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    return {
        "apiVersion": ADMISSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": meta("gpustack-models-node-writes"),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [rule]},
            "matchConditions": [{"name": "isService", "expression": _is_service()["expression"]}],
            "variables": variables,
            "validations": [dict(validation, reason="Forbidden")],
        },
    }


def policy_objects() -> list[dict]:
    policies = [storage_writes_policy(), status_writes_policy(), node_writes_policy(), model_volumes_policy()]
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
