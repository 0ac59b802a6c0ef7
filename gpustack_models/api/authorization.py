"""Delegated authorization: every request is a SubjectAccessReview for the caller (cached briefly).

kube-apiserver authorizes proxied requests itself, but callers that reach the API directly (a Pod with
a token, anything that can reach the Service) are only stopped here.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from rest_framework.permissions import BasePermission

from gpustack_models import kube
from gpustack_models.api import api_metrics
from gpustack_models.api.authentication import KubeUser
from gpustack_models.kube.errors import Forbidden, Unauthorized
from gpustack_models.kube.reviews import TTLCache

ALWAYS_ALLOWED_PATHS = frozenset({"/healthz", "/livez", "/readyz"})


@dataclass(frozen=True)
class ResourceAttributes:
    verb: str
    group: str
    version: str
    resource: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""

    def to_review(self) -> dict:
        out = {"verb": self.verb, "group": self.group, "version": self.version, "resource": self.resource}
        for key in ("namespace", "name", "subresource"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    def denial(self, user: KubeUser, reason: str = "") -> Forbidden:
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        subject = f'{resource} "{self.name}"' if self.name else resource
        scope = f' in the namespace "{self.namespace}"' if self.namespace else " at the cluster scope"
        message = (
            f'{subject} is forbidden: User "{user.username}" cannot {self.verb} resource "{resource}" '
            f'in API group "{self.group}"{scope}'
        )
        if reason:
            message += f": {reason}"
        details = {"group": self.group, "kind": self.resource}
        if self.name:
            details["name"] = self.name
        return Forbidden(message, details=details)


@dataclass(frozen=True)
class NonResourceAttributes:
    verb: str
    path: str

    def to_review(self) -> dict:
        return {"verb": self.verb, "path": self.path}

    def denial(self, user: KubeUser, reason: str = "") -> Forbidden:
        message = f'forbidden: User "{user.username}" cannot {self.verb} path "{self.path}"'
        if reason:
            message += f": {reason}"
        return Forbidden(message)


_cache = TTLCache(maxsize=settings.AUTH_CACHE_SIZE)


def review(user: KubeUser, attributes: ResourceAttributes | NonResourceAttributes) -> tuple[bool, str]:
    """(allowed, reason) for ``user`` doing ``attributes``; ``system:masters`` is always allowed."""
    if user.is_master():
        return True, ""
    key = (user, attributes)
    hit = _cache.get(key)
    api_metrics.auth_cache("subjectaccessreview", hit is not None)
    if hit is not None:
        return hit
    spec = {"user": user.username, "groups": list(user.groups)}
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = user.extra_dict
    if isinstance(attributes, ResourceAttributes):
        spec["resourceAttributes"] = attributes.to_review()
    else:
        spec["nonResourceAttributes"] = attributes.to_review()
    answer = kube.default().create(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
    )
    status = answer.get("status") or {}
    result = (bool(status.get("allowed")) and not status.get("denied"), status.get("reason", ""))
    _cache.set(key, result, settings.AUTH_CACHE_TTL)
    return result


def require(user: KubeUser, attributes) -> None:
    allowed, reason = review(user, attributes)
    if not allowed:
        raise attributes.denial(user, reason)


def clear_cache() -> None:
    _cache.clear()


class SubjectAccessReviewPermission(BasePermission):
    """Asks kube-apiserver whether the caller may do what the view says the request is.

    The view supplies the attributes through ``authorization_attributes(request)``; health paths never
    reach a review.
    """

    def has_permission(self, request, view) -> bool:
        if request.path in ALWAYS_ALLOWED_PATHS:
            return True
        user = request.user
        if not isinstance(user, KubeUser):
            raise Unauthorized("Unauthorized")
        require(user, view.authorization_attributes(request))
        return True
