"""The checks of a Pod's model volumes at its creation, so a mistake shows at ``kubectl create`` and not, later,
in the kubelet's events of a Pod that never starts.

- ``model_volumes_policy``: a ValidatingAdmissionPolicy refusing a malformed model volume (an attribute
  the driver does not read, no ``artifact`` or not a ModelArtifact name, a malformed ``expectedDigest``,
  ``readOnly`` not true). It runs inside kube-apiserver, so it holds while the API is down. Its rules are
  the CSI driver's, no stricter, and its messages are ``kube.volumes``' texts, which the webhooks use too
  (``volume_problems``): one definition for the driver, the policy and the webhooks. Its
  ``failurePolicy`` is ``Ignore``: the driver refuses such a volume at mount anyway, so an evaluation
  error must not keep a Pod out.
- ``volume_warnings_webhook``: a ValidatingWebhookConfiguration for ``POST /internal/v1/volumes``
  (``webhooks.volume_warnings``), which always admits and warns when a model volume names a ModelArtifact that
  does not exist or is not resolved. It fails open (``Ignore``, 2 s): with the API down a Pod is created
  without the warnings. Its caller needs ``post`` on the path, like the placement webhook's
  (``caller_objects``). It is not installed in the node-labels placement mode, where kube-apiserver cannot
  authenticate to the API: the webhook would have to answer anyone, telling them which artifacts exist.
"""

from __future__ import annotations

import re

from gpustack_models.install.common import meta
from gpustack_models.install.webhooks import MOUNTS_A_MODEL, caller_objects, client_config, pod_create_webhook
from gpustack_models.kube import volumes as rules

ADMISSION = "admissionregistration.k8s.io/v1"
POLICY = "gpustack-models-model-volumes"
NAME = "gpustack-models-volumes"
PATH = "/internal/v1/volumes"
CALLER_ROLE = "gpustack-models:volume-warnings-caller"

_PATH = "'spec.volumes[' + string(object.spec.volumes.indexOf(v)) + '].csi'"
_ATTRS = "(has(v.csi.volumeAttributes) ? v.csi.volumeAttributes : {})"


def cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cel_format(template: str, **values: str) -> str:
    """A CEL expression for ``template`` (a ``kube.volumes`` text) with its ``{name}`` fields the CEL
    expressions ``values``."""
    parts = re.split(r"\{(\w+)\}", template)  # literal, name, literal, ...
    return " + ".join(values[p] if i % 2 else cel_string(p) for i, p in enumerate(parts) if i % 2 or p)


def _anchored(pattern: str) -> str:
    """A full-match pattern as CEL's ``matches`` (RE2, finding it anywhere) reads it."""
    return cel_string("^" + pattern + "$")


def _attr(key: str) -> str:
    return f"{_ATTRS}[{cel_string(key)}]"


def volume_problems_cel() -> str:
    """The problems of one model volume ``v`` as a list of texts, in ``kube.volumes.volume_problems``' order."""
    allowed = "[" + ", ".join(cel_string(a) for a in rules.ATTRIBUTES) + "]"
    unknown = (
        f"{_ATTRS}.filter(k, !(k in {allowed}) && !k.startsWith({cel_string(rules.KUBE_PREFIX)}))"
        f".map(k, {cel_format(rules.UNKNOWN, path=_PATH, key='k')})"
    )
    artifact, digest = _attr(rules.ARTIFACT), _attr(rules.EXPECTED_DIGEST)
    missing = f"!({cel_string(rules.ARTIFACT)} in {_ATTRS}) || {artifact} == ''"
    bad_name = f"size({artifact}) > {rules.NAME_MAX} || !{artifact}.matches({_anchored(rules.NAME_PATTERN)})"
    bad_digest = (
        f"{cel_string(rules.EXPECTED_DIGEST)} in {_ATTRS} && {digest} != '' && "
        f"!{digest}.matches({_anchored(rules.DIGEST_PATTERN)})"
    )
    checks = [
        f"{missing} ? {cel_format(rules.REQUIRED, path=_PATH)} : "
        f"({bad_name} ? {cel_format(rules.BAD_NAME, path=_PATH)} : '')",
        f"{bad_digest} ? {cel_format(rules.BAD_DIGEST, path=_PATH)} : ''",
        f"has(v.csi.readOnly) && v.csi.readOnly ? '' : {cel_format(rules.NOT_READ_ONLY, path=_PATH)}",
    ]
    return f"{unknown} + [{', '.join(checks)}].filter(s, s != '')"


def model_volumes_policy() -> dict:
    """Pod creates whose model volumes the driver would refuse: refused, every problem named by its field."""
    variables = [
        {
            "name": "models",
            "expression": f"object.spec.volumes.filter(v, has(v.csi) && v.csi.driver == '{rules.MODEL_DRIVER}')",
        },
        {
            "name": "problems",
            "expression": f"variables.models.map(v, ({volume_problems_cel()}).join('; ')).filter(s, s != '')",
        },
    ]
    validation = {
        "expression": "size(variables.problems) == 0",
        "messageExpression": "variables.problems.join('; ')",
        "message": "a model volume is malformed",
        "reason": "Invalid",
    }
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    return {
        "apiVersion": ADMISSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": meta(POLICY),
        "spec": {
            "failurePolicy": "Ignore",
            "matchConstraints": {"resourceRules": [rule]},
            "matchConditions": [{"name": "mounts-a-model", "expression": MOUNTS_A_MODEL}],
            "variables": variables,
            "validations": [validation],
        },
    }


def volume_warnings_webhook(url: str | None = None, ca_bundle: bytes | None = None) -> dict:
    """The configuration, calling ``url`` (a local API process) or else the API's Service."""
    webhook = pod_create_webhook("volumes.model.csi.gpustack.ai", client_config(PATH, url, ca_bundle))
    return {"apiVersion": ADMISSION, "kind": "ValidatingWebhookConfiguration", "metadata": meta(NAME),
            "webhooks": [webhook]}  # fmt: skip


def volume_caller_objects() -> list[dict]:
    """``post`` on the warnings' path for the webhooks' caller (``GPUSTACK_PLACEMENT_CALLER``), and nobody else."""
    return caller_objects(CALLER_ROLE, PATH)


def volume_warning_objects() -> list[dict]:
    """What ``deploy/`` holds (not applied in the node-labels placement mode): the caller's RBAC and the
    configuration through the Service."""
    return volume_caller_objects() + [volume_warnings_webhook()]
