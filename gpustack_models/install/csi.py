"""The CSIDriver object of ``model.csi.gpustack.ai``: what the kubelet needs to know of the node plugin's
CSI driver before it calls it.

No attach step (``attachRequired: false``: nothing to attach, the content is on the node), the Pod's
namespace, name and uid in every NodePublishVolume (``podInfoOnMount: true``: the API authorizes the
mount for that Pod), inline ephemeral volumes only, no fsGroup change of read-only content, and no
periodic republish.
"""

from __future__ import annotations

from gpustack_models.install.common import meta
from gpustack_models.plugin.csi import DRIVER_NAME


def csi_driver_objects() -> list[dict]:
    return [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": meta(DRIVER_NAME),
            "spec": {
                "attachRequired": False,
                "podInfoOnMount": True,
                "volumeLifecycleModes": ["Ephemeral"],
                "fsGroupPolicy": "None",
                "requiresRepublish": False,
            },
        }
    ]
