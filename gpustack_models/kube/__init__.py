"""The worker's access to Kubernetes.

- ``client``: ``Kube``, one connection pool to kube-apiserver with the worker's identity (``worker()``);
- ``errors``: every Kubernetes error reason as an exception class (``NotFound``, ``Conflict`` ...);
- ``watch``: the one list-then-watch loop every watcher uses;
- ``reviews``: TokenReview answers, cached briefly;
- ``identity``: the service's own ServiceAccounts.

Nothing here imports the API, the worker's reconcilers or the plugin.
"""

from gpustack_models.kube.client import Kube, Response, load_configuration, reset, worker
from gpustack_models.kube.errors import (
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
    Unauthorized,
    UnsupportedMediaType,
    error_for,
    status_body,
)

__all__ = [
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
    "Response",
    "StatusError",
    "Unauthorized",
    "UnsupportedMediaType",
    "error_for",
    "load_configuration",
    "reset",
    "status_body",
    "worker",
]
