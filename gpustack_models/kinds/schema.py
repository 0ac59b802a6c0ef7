"""A small declarative vocabulary for resource schemas.

A resource kind is described once with these nodes; the CRD's structural OpenAPI schema (with its CEL
rules), the public API's OpenAPI document and the field documentation behind ``kubectl explain`` are
all rendered from the same tree, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Rule:
    """A CEL validation rule (``x-kubernetes-validations``) evaluated by kube-apiserver."""

    rule: str
    message: str
    field_path: str = ""
    reason: str = ""

    def to_openapi(self) -> dict:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class Schema:
    type: str
    description: str = ""
    properties: dict[str, Schema] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    items: Schema | None = None
    additional: Schema | None = None
    enum: tuple = ()
    pattern: str = ""
    format: str = ""
    default: object = None
    minimum: int | None = None
    maximum: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    list_type: str = ""
    list_map_keys: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()
    preserve_unknown: bool = False
    int_or_string: bool = False

    def with_rules(self, *rules: Rule) -> Schema:
        return replace(self, rules=self.rules + tuple(rules))

    def to_openapi(self) -> dict:
        """The structural schema kube-apiserver accepts in a CRD (and OpenAPI v3 shows)."""
        out: dict = {"x-kubernetes-int-or-string": True} if self.int_or_string else {"type": self.type}
        for key, value in self._openapi_values():
            if value is not None and value != "":
                out[key] = value
        return out

    def _openapi_values(self):
        """(OpenAPI key, value) pairs; empty values are left out of the document."""
        yield "description", self.description
        yield "format", self.format
        yield "enum", list(self.enum) or None
        yield "pattern", self.pattern
        yield "default", self.default
        yield "minimum", self.minimum
        yield "maximum", self.maximum
        yield "minLength", self.min_length
        yield "maxLength", self.max_length
        yield "minItems", self.min_items
        yield "maxItems", self.max_items
        yield "properties", {name: sub.to_openapi() for name, sub in self.properties.items()} or None
        yield "required", list(self.required) or None
        yield "additionalProperties", self.additional.to_openapi() if self.additional is not None else None
        yield "items", self.items.to_openapi() if self.items is not None else None
        yield "x-kubernetes-list-type", self.list_type
        yield "x-kubernetes-list-map-keys", list(self.list_map_keys) or None
        yield "x-kubernetes-preserve-unknown-fields", True if self.preserve_unknown else None
        yield "x-kubernetes-validations", [r.to_openapi() for r in self.rules] or None

    def walk(self, path: str = ""):
        """Yield ``(path, schema)`` for this node and every node below it (``[]`` marks list items)."""
        yield path, self
        for name, sub in self.properties.items():
            yield from sub.walk(f"{path}.{name}" if path else name)
        if self.items is not None:
            yield from self.items.walk(f"{path}[]")
        if self.additional is not None:
            yield from self.additional.walk(f"{path}{{}}")


def obj(description: str = "", *, required=(), rules=(), default=None, **properties: Schema) -> Schema:
    return Schema(
        "object", description, properties=properties, required=tuple(required), rules=tuple(rules), default=default
    )


def string(description: str = "", **kw) -> Schema:
    return Schema("string", description, **kw)


def integer(description: str = "", *, int64: bool = False, **kw) -> Schema:
    return Schema("integer", description, format="int64" if int64 else kw.pop("format", "int32"), **kw)


def boolean(description: str = "", **kw) -> Schema:
    return Schema("boolean", description, **kw)


def array(items: Schema, description: str = "", **kw) -> Schema:
    return Schema("array", description, items=items, **kw)


def string_map(description: str = "") -> Schema:
    return Schema("object", description, additional=string(max_length=63))


def timestamp(description: str = "") -> Schema:
    return string(description, format="date-time")


# --- Shared shapes ----------------------------------------------------------------------------------

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"


def object_name(description: str) -> Schema:
    return string(description, pattern=DNS_SUBDOMAIN, min_length=1, max_length=253)


def digest(description: str) -> Schema:
    return string(description, pattern=DIGEST_PATTERN, max_length=71)


def conditions(description: str = "Latest observations of the object's state.") -> Schema:
    """The shape of ``metav1.Condition`` lists, keyed by ``type``."""
    condition = obj(
        "One aspect of the object's state.",
        required=("type", "status", "lastTransitionTime", "reason", "message"),
        type=string("Type of condition in CamelCase.", max_length=316),
        status=string("Status of the condition: True, False or Unknown.", enum=("True", "False", "Unknown")),
        observedGeneration=integer("The .metadata.generation the condition was set from.", int64=True, minimum=0),
        lastTransitionTime=timestamp("When the condition last changed from one status to another."),
        reason=string(
            "A programmatic identifier of the reason for the last transition, in CamelCase.",
            max_length=1024,
            min_length=1,
        ),
        message=string("A human-readable message with details about the transition.", max_length=32768),
    )
    return array(condition, description, max_items=16, list_type="map", list_map_keys=("type",))


def label_selector(description: str) -> Schema:
    requirement = obj(
        "A label selector requirement: a key, an operator and values.",
        required=("key", "operator"),
        key=string("The label key the selector applies to.", max_length=317),
        operator=string("The key's relationship to the values.", enum=("In", "NotIn", "Exists", "DoesNotExist")),
        values=array(
            string(max_length=63),
            "Values for In and NotIn; empty for Exists and DoesNotExist.",
            max_items=64,
            list_type="atomic",
        ),
    )
    return obj(
        description,
        matchLabels=string_map("Labels a node must carry, each key equal to its value."),
        matchExpressions=array(requirement, "Label requirements, all of which must hold.", max_items=32),
    )
