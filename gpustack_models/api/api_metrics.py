"""Prometheus metrics of the aggregated API, and its ``/metrics`` endpoint.

Families (labels are bounded: verbs, resource plurals, route paths, codes; never an object's name or a
namespace):

- ``gpustack_models_api_requests_total{verb, resource, code}``: requests answered, by Kubernetes verb
  (get, list, watch, create, update, patch, delete, deletecollection; the lower-case HTTP method on the
  paths that are no resource), resource (the plural, with its subresource: ``modelartifacts/progress``;
  ``unknown`` for a plural or subresource v1 does not have; the route for the other paths: ``/apis``,
  ``/openapi/v2``, ``/internal/v1/tickets``...) and status code;
- ``gpustack_models_api_request_duration_seconds{verb, resource}``: until the answer was ready (a watch:
  until its stream started);
- ``gpustack_models_api_auth_cache_requests_total{cache, result}``: TokenReview and SubjectAccessReview
  answers found in their caches (``hit``) or asked of kube-apiserver (``miss``);
- ``gpustack_models_placement_webhook_calls_total{outcome}``: placement reviews answered ``patched``
  (node affinity added), ``unchanged`` or ``error`` (admitted unchanged, the placement failed);
  each outcome is a series from the start.

``/metrics`` is served on the API's HTTPS port, as kube components serve theirs: the caller must be
authenticated and allowed ``get`` on the non-resource URL ``/metrics`` (a SubjectAccessReview).
With several gunicorn workers, one scrape sums them all (``telemetry``'s multiprocess mode).
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from gpustack_models.api.verbs import request_verb
from gpustack_models.kinds import BY_PLURAL
from gpustack_models.telemetry.registry import scrape_registry

REQUESTS = Counter("gpustack_models_api_requests_total", "API requests answered.", ["verb", "resource", "code"])
DURATION = Histogram(
    "gpustack_models_api_request_duration_seconds",
    "Seconds until an API request's answer was ready (a watch: until its stream started).",
    ["verb", "resource"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
AUTH_CACHE = Counter(
    "gpustack_models_api_auth_cache_requests_total",
    "TokenReview and SubjectAccessReview answers taken from the cache (hit) or asked of kube-apiserver (miss).",
    ["cache", "result"],
)
PLACEMENT = Counter(
    "gpustack_models_placement_webhook_calls_total", "Placement webhook reviews answered, by outcome.", ["outcome"]
)
PLACEMENT_OUTCOMES = ("patched", "unchanged", "error")
for _outcome in PLACEMENT_OUTCOMES:  # series from the start (at 0), before the first review
    PLACEMENT.labels(_outcome)

SUBRESOURCES = frozenset({"status", "progress"})
HTTP_METHODS = frozenset({"get", "head", "post", "put", "patch", "delete", "options"})
WATCH_VALUES = frozenset({"true", "1", "on", ""})


def _watching(request) -> bool:
    value = request.GET.get("watch")
    return value is not None and value.lower() in WATCH_VALUES


def labels(request, kwargs: dict, route: str) -> tuple[str, str]:
    """(verb, resource) of a request: ``route`` names a path that is no resource (``/apis``...), or a
    resource path (``modelartifacts/progress``); empty: the resource is read from the URL's plural."""
    method = request.method.lower()
    if route.startswith("/"):
        return (method if method in HTTP_METHODS else "other"), route
    if not route:
        plural = kwargs.get("plural")
        route = plural if plural in BY_PLURAL else "unknown"
        subresource = kwargs.get("subresource")
        if subresource:
            route += "/" + (subresource if subresource in SUBRESOURCES else "unknown")
    if method not in HTTP_METHODS:
        return "other", route
    return request_verb(request.method, bool(kwargs.get("name")), _watching(request)), route


def observe(request, kwargs: dict, route: str, code: int, started: float) -> None:
    """Count one answered request (one counter increment, one histogram observation)."""
    verb, resource = labels(request, kwargs, route)
    REQUESTS.labels(verb, resource, str(code)).inc()
    DURATION.labels(verb, resource).observe(time.perf_counter() - started)


def auth_cache(cache: str, hit: bool) -> None:
    AUTH_CACHE.labels(cache, "hit" if hit else "miss").inc()


def placement(outcome: str) -> None:
    PLACEMENT.labels(outcome).inc()


_registry = None


def registry():
    global _registry
    if _registry is None:
        _registry = scrape_registry()
    return _registry


def exposition() -> tuple[bytes, str]:
    """The scrape's body and content type."""
    return generate_latest(registry()), CONTENT_TYPE_LATEST
