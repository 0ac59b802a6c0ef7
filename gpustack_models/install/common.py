"""What every installed object shares: its labels, and the service's identities."""

from __future__ import annotations

from django.conf import settings

LABELS = {"app.kubernetes.io/part-of": "gpustack-models"}
RBAC = "rbac.authorization.k8s.io"


def meta(name: str, namespace: str | None = None) -> dict:
    out = {"name": name, "labels": dict(LABELS)}
    if namespace:
        out["namespace"] = namespace
    return out


def service_account_subject(name: str) -> list[dict]:
    return [{"kind": "ServiceAccount", "name": name, "namespace": settings.NAMESPACE}]
