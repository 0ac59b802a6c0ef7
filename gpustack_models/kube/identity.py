"""Who the service's own processes are to Kubernetes."""

from __future__ import annotations

from django.conf import settings

# The extra a Pod-bound ServiceAccount token carries: the node its Pod runs on.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def service_account_user(name: str) -> str:
    """The username of ServiceAccount ``name`` in the service's namespace."""
    return f"system:serviceaccount:{settings.NAMESPACE}:{name}"


def service_user() -> str:
    return service_account_user(settings.SERVICE_ACCOUNT)


def plugin_user() -> str:
    return service_account_user(settings.PLUGIN_SERVICE_ACCOUNT)
