"""The Kubernetes verb of an HTTP request on a resource: what authorization asks about and what the
metrics count (``resources`` and ``api_metrics`` both build on it; it imports neither)."""

from __future__ import annotations


def request_verb(method: str, named: bool, watching: bool) -> str:
    """The Kubernetes verb of an HTTP request on a resource."""
    if method in ("GET", "HEAD"):
        if watching:
            return "watch"
        return "get" if named else "list"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
