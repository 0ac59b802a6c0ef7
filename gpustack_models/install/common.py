"""What every installed object shares: its labels, the service's identities, and how a generated file of
several objects is written."""

from __future__ import annotations

import yaml
from django.conf import settings

from gpustack_models.kinds.crd import HEADER

LABELS = {"app.kubernetes.io/part-of": "gpustack-models"}
RBAC = "rbac.authorization.k8s.io"


def meta(name: str, namespace: str | None = None) -> dict:
    out = {"name": name, "labels": dict(LABELS)}
    if namespace:
        out["namespace"] = namespace
    return out


def service_account_subject(name: str) -> list[dict]:
    return [{"kind": "ServiceAccount", "name": name, "namespace": settings.NAMESPACE}]


def render(objects: list[dict]) -> str:
    """``objects`` as one generated YAML file (a document each)."""
    return HEADER + yaml.safe_dump_all(objects, sort_keys=False, width=100)
