"""The service's (and the plugin's) access to Kubernetes.

- ``client``: ``Kube``, one connection pool to kube-apiserver; ``default()``, the process's own (the service's
  identity, or the plugin's);
- ``errors``: every Kubernetes error reason as an exception class (``NotFound``, ``Conflict`` ...);
- ``watch``: the one list-then-watch loop every watcher uses;
- ``reviews``: TokenReview answers, cached briefly;
- ``identity``: the service's own ServiceAccounts;
- ``volumes``: the volume ids the kubelet gives a Pod's inline CSI volumes, and what a model volume must be.

Nothing here imports the API, the reconcilers or the plugin.
"""

from gpustack_models.kube.client import Kube, KubeResponse, default, load_configuration, reset
from gpustack_models.kube.errors import (
    STARTING,
    UNREACHABLE,
    AlreadyExists,
    BadRequest,
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    MethodNotAllowed,
    NotAcceptable,
    NotFound,
    RequestEntityTooLarge,
    StatusError,
    StillConflicting,
    Unauthorized,
    UnsupportedMediaType,
    error_for,
    status_body,
)

__all__ = [
    "STARTING",
    "UNREACHABLE",
    "AlreadyExists",
    "BadRequest",
    "Conflict",
    "Expired",
    "Forbidden",
    "Invalid",
    "Kube",
    "MethodNotAllowed",
    "NotAcceptable",
    "NotFound",
    "RequestEntityTooLarge",
    "KubeResponse",
    "StatusError",
    "StillConflicting",
    "Unauthorized",
    "UnsupportedMediaType",
    "default",
    "error_for",
    "load_configuration",
    "reset",
    "status_body",
]
