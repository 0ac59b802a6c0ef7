"""OCI references (``[registry/]repository[:tag][@sha256:<hex>]``) and the registry each names.

Kept apart from ``sources.oci`` (which talks to registries): the resource kinds validate a reference
with the same grammar, and the node plugin reads a ticket's repository with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The distribution project's reference grammar (reference/regexp.go), anchored.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
)
REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_REFERENCE = re.compile(
    rf"(?:(?P<registry>{_DOMAIN}(?::[0-9]+)?)/)?(?P<repository>{REPOSITORY.pattern})"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?"
)
# The same grammar without group names, for the resource's schema (kube-apiserver checks it too).
OCI_REFERENCE_PATTERN = re.sub(r"\?P<\w+>", "?:", _REFERENCE.pattern)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io")  # what Docker's own configs and tools name it


class InvalidReference(ValueError):
    """A reference that is not ``[registry/]repository[:tag][@sha256:<hex>]``."""


@dataclass(frozen=True)
class Reference:
    """``registry`` (``host[:port]``), ``repository``, and a ``tag`` and/or a ``digest``."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> Reference:
        m = _REFERENCE.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise InvalidReference(f"{text!r} is not a reference of the form registry/repository[:tag][@sha256:<hex>]")
        registry, repository = m.group("registry"), m.group("repository")
        if registry and not ("." in registry or ":" in registry or registry == "localhost"):
            registry, repository = None, f"{registry}/{repository}"  # "team/model": a Docker Hub path
        if not REPOSITORY.fullmatch(repository):
            raise InvalidReference(f"{text!r}: repository {repository!r} must be lowercase path components")
        registry = DOCKER_HUB if registry in (None, *DOCKER_HUB_ALIASES) else registry
        if registry == DOCKER_HUB and "/" not in repository:
            repository = f"library/{repository}"
        if len(repository) > 255:
            raise InvalidReference(f"{text!r}: the repository is longer than 255 characters")
        return cls(registry, repository, m.group("tag"), m.group("digest"))

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    @property
    def asked(self) -> str:
        """What the manifest is asked for by: the digest when given (the tag is then only a label)."""
        return self.digest or self.tag or "latest"


def endpoint(registry: str, insecure_registries=()) -> str:
    """The registry's base URL: ``https://`` unless ``registry`` (or its host alone) is listed insecure."""
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    if registry == DOCKER_HUB:
        return "https://registry-1.docker.io"
    plain = registry in insecure_registries or host in insecure_registries
    return f"{'http' if plain else 'https'}://{registry}"


def registry_of(base: str) -> str:
    """The registry (``host[:port]``, as a Docker config names it) of a base URL made by ``endpoint``."""
    netloc = base.split("://", 1)[-1].split("/", 1)[0].lower()
    return DOCKER_HUB if netloc in DOCKER_HUB_ALIASES else netloc
