"""Aggregation: the Service and APIService that route ``worker.gpustack.ai/v1`` to the worker's API."""

from __future__ import annotations

import base64

from django.conf import settings

from gpustack_models.install.common import meta
from gpustack_models.kinds import GROUP, PUBLIC_VERSION

API_LABELS = {"app.kubernetes.io/name": "gpustack-models-api"}


def api_service(ca_bundle: bytes, port: int, in_cluster: bool = False) -> list[dict]:
    """The Service and APIService that route ``worker.gpustack.ai/v1`` to the worker.

    In a cluster the Service selects the API's Pods (the chart's, labelled ``API_LABELS``, port ``https``).
    For an API outside the cluster (local runs, tests) it is an ExternalName ``localhost``:
    EndpointSlices refuse loopback addresses, and kube-apiserver dials ``<externalName>:<port>``.
    """
    name, ns = settings.API_SERVICE_NAME, settings.NAMESPACE
    if in_cluster:
        spec = {
            "type": "ClusterIP",
            "selector": dict(API_LABELS),
            "ports": [{"name": "https", "port": port, "targetPort": "https", "protocol": "TCP"}],
        }
    else:
        spec = {
            "type": "ExternalName",
            "externalName": "localhost",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, ns), "spec": spec},
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": meta(f"{PUBLIC_VERSION}.{GROUP}"),
            "spec": {
                "group": GROUP,
                "version": PUBLIC_VERSION,
                "groupPriorityMinimum": 1000,
                "versionPriority": 200,
                "service": {"namespace": ns, "name": name, "port": port},
                "caBundle": base64.b64encode(ca_bundle).decode(),
            },
        },
    ]


def serving_names() -> list[str]:
    name, ns = settings.API_SERVICE_NAME, settings.NAMESPACE
    return [f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local", f"{name}.{ns}", "localhost"]
