"""What a v1 request names and asks for, read exactly as kube-apiserver reads it.

Names: a path segment of ``.`` or ``..``, or one holding ``/`` or ``%``, is refused with 400 as
kube-apiserver refuses it (``ValidatePathSegmentName``); any other name that is not a DNS subdomain (a
namespace: a DNS label) cannot name an object of these kinds, so it is not found. Both are decided before
authorization, and every segment sent upstream is percent-quoted: a name can never turn a get into a list,
or a delete into a collection delete.

Query: a parameter's first value counts, and a boolean is true unless it is ``0`` or ``false`` (so
``watch=`` and ``watch=on`` watch). The query sent upstream is rebuilt from what was parsed and authorized.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode

from gpustack_models.api.status import not_found
from gpustack_models.kinds import BY_PLURAL, GROUP, STORAGE_VERSION
from gpustack_models.kinds.base import ResourceKind
from gpustack_models.kube.errors import BadRequest

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(_LABEL)
DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def check_path_segment(what: str, value: str) -> None:
    """400 for a segment kube-apiserver refuses in a path (``ValidatePathSegmentName``)."""
    if value in (".", ".."):
        raise BadRequest(f'{what} may not be "{value}"')
    for forbidden in ("/", "%"):
        if forbidden in value:
            raise BadRequest(f'{what} may not contain "{forbidden}"')


def is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and DNS_SUBDOMAIN.fullmatch(value) is not None


def is_dns_label(value: str) -> bool:
    return len(value) <= 63 and DNS_LABEL.fullmatch(value) is not None


@dataclass(frozen=True)
class Target:
    """What a URL names: a kind, a namespace (namespaced kinds), and a name (empty for a collection)."""

    kind: ResourceKind
    namespace: str = ""
    name: str = ""

    @classmethod
    def from_url(cls, kwargs: dict, method: str) -> Target:
        kind = BY_PLURAL.get(kwargs.get("plural"))
        namespace, name = kwargs.get("namespace") or "", kwargs.get("name") or ""
        if kind is None or (namespace and not kind.namespaced):
            raise not_found()
        if kind.namespaced and not namespace and (name or method not in ("GET", "HEAD")):
            raise not_found()
        return cls.checked(kind, namespace, name)

    @classmethod
    def checked(cls, kind: ResourceKind, namespace: str, name: str) -> Target:
        """The target, if its namespace and name could name an object of ``kind`` (400/404 otherwise)."""
        check_path_segment("namespace", namespace)
        check_path_segment("name", name)
        if (namespace and not is_dns_label(namespace)) or (name and not is_dns_subdomain(name)):
            raise not_found()
        return cls(kind, namespace, name)

    def storage_path(self, name: str | None = None) -> str:
        """The storage path of the object (``name``: another one; ``""``: the collection), quoted."""
        path = f"/apis/{GROUP}/{STORAGE_VERSION}"
        if self.namespace:
            path += f"/namespaces/{quote(self.namespace, safe='')}"
        path += f"/{self.kind.plural}"
        name = self.name if name is None else name
        return f"{path}/{quote(name, safe='')}" if name else path


def parse_bool(value: str | None) -> bool:
    """A query boolean as kube-apiserver converts it: anything but ``0`` or ``false`` is true."""
    return value is not None and value != "0" and value.lower() != "false"


class Query:
    """A request's query parameters, in order, as received."""

    def __init__(self, query_string: str):
        self.items = parse_qsl(query_string, keep_blank_values=True)

    @classmethod
    def of(cls, request) -> Query:
        return cls(request.META.get("QUERY_STRING", ""))

    def get(self, key: str, default: str | None = None) -> str | None:
        """The first value of ``key`` (kube-apiserver decodes a scalar from the first value)."""
        return next((value for name, value in self.items if name == key), default)

    @property
    def watch(self) -> bool:
        return parse_bool(self.get("watch"))

    def upstream(self, *, watch: bool, **replace: str) -> str:
        """The query to send kube-apiserver: ``watch`` as decided here, ``replace`` overriding parameters."""
        dropped = {"watch", *replace}
        items = [(name, value) for name, value in self.items if name not in dropped]
        if watch:
            items.append(("watch", "true"))
        items.extend(replace.items())
        return urlencode(items)
