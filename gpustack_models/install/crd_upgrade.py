"""Upgrading the storage CRDs with the chart (``manage.py applycrds``, its pre-install and pre-upgrade hook).

Helm installs a chart's ``crds/`` directory on the first install only and never upgrades it; the hook applies
the same definitions (``kinds.crd``, which also write ``deploy/crds``) server-side with a field manager of
its own, forcing its ownership of the fields, and waits until kube-apiserver serves them (Established).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpustack_models import kube
from gpustack_models.kinds import KINDS
from gpustack_models.kinds.crd import crd_for

FIELD_MANAGER = "gpustack-models-crds"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class CrdError(Exception):
    """A CRD was refused or did not become Established; the message names it."""


def condition(obj: dict, kind: str) -> dict:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def apply_crds(client: kube.Kube, timeout: float, say: Callable[[str], None]) -> list[str]:
    """Apply every storage CRD and wait until each is Established; returns their names."""
    names = []
    for kind in KINDS:
        body = crd_for(kind)
        name = body["metadata"]["name"]
        try:
            applied = client.apply(f"{CRDS}/{name}", body, field_manager=FIELD_MANAGER, force=True)
        except kube.StatusError as exc:
            raise CrdError(f"applying {name}: {exc}") from None
        say(f"applied {name} (resourceVersion {applied['metadata']['resourceVersion']})")
        names.append(name)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            established = condition(client.get(f"{CRDS}/{name}"), "Established")
            if established.get("status") == "True":
                say(f"{name} is Established")
                break
            if time.monotonic() >= deadline:
                raise CrdError(f"{name} not Established after {timeout:.0f}s: {established.get('message', '')}")
            time.sleep(0.5)
    return names
