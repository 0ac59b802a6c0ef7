"""Everything installed into a cluster besides the CRDs (``kinds.crd``), from the same definitions:
the namespace and ServiceAccounts, RBAC (``rbac``), the admission policies guarding the storage version
(``policies``), the aggregation (``aggregation``), the placement webhook (``webhooks``), the checks of a
Pod's model volumes (``volume_checks``) and the CSIDriver object of the node plugin's CSI driver (``csi``).

``python manage.py writemanifests`` writes the static ones to ``deploy/``; the local launcher and the
test fixtures apply them, plus the APIService for the local API with its serving CA.
"""

from __future__ import annotations

from pathlib import Path

from gpustack_models.install.aggregation import api_service, serving_names
from gpustack_models.install.chart import chart_files
from gpustack_models.install.common import render
from gpustack_models.install.csi import csi_driver_objects
from gpustack_models.install.policies import policy_objects
from gpustack_models.install.rbac import namespace_objects, rbac_objects
from gpustack_models.install.volume_checks import volume_caller_objects, volume_warning_objects, volume_warnings_webhook
from gpustack_models.install.webhooks import caller_objects, label_writer_objects, placement_webhook, webhook_objects
from gpustack_models.kinds.crd import crd_files

DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"


def manifest_files() -> dict[Path, str]:
    return {
        DEPLOY_DIR / "service" / "namespace.yaml": render(namespace_objects()),
        DEPLOY_DIR / "service" / "rbac.yaml": render(rbac_objects()),
        DEPLOY_DIR / "service" / "admission-policies.yaml": render(policy_objects()),
        DEPLOY_DIR / "service" / "placement-webhook.yaml": render(webhook_objects()),
        # Applied instead of the caller's right above where the API runs with GPUSTACK_PLACEMENT_MODE=nodeLabels.
        DEPLOY_DIR / "service" / "placement-labels.yaml": render(label_writer_objects()),
        # Not applied where the API runs with GPUSTACK_PLACEMENT_MODE=nodeLabels (install/volume_checks.py says why).
        DEPLOY_DIR / "service" / "volume-warnings.yaml": render(volume_warning_objects()),
        DEPLOY_DIR / "csi" / "csidriver.yaml": render(csi_driver_objects()),
    }


def deploy_files() -> dict[Path, str]:
    """Everything under deploy/ that is generated: the CRDs, the files above and the chart's generated part."""
    return {**crd_files(), **manifest_files(), **chart_files()}


def stale_files() -> list[Path]:
    return [path for path, text in deploy_files().items() if not path.exists() or path.read_text() != text]


__all__ = [
    "api_service",
    "caller_objects",
    "csi_driver_objects",
    "deploy_files",
    "label_writer_objects",
    "manifest_files",
    "namespace_objects",
    "placement_webhook",
    "policy_objects",
    "rbac_objects",
    "render",
    "serving_names",
    "stale_files",
    "volume_caller_objects",
    "volume_warning_objects",
    "volume_warnings_webhook",
    "webhook_objects",
]
