"""The hub side of resolution: from a repository at a revision to a commit and a manifest digest.

No Django and no Kubernetes here: callers pass the endpoint, token, proxy and CA bundle explicitly.

- ``huggingface.resolve`` / ``modelscope.resolve`` -> ``ResolvedRevision(commit, files, pinned, note)`` or
  ``SourceError`` (``pinned`` False: the hub named no commit, see ``ResolvedRevision``);
- ``hub_errors``: what a hub's (or a peer's) status, error code and ``Retry-After`` mean, and the one
  failure type (``Failure``: reason, message, retry-after) of resolution, downloads and peers;
- ``manifest``: ``ManifestFile``, ``select_files`` (the patterns, exactly as huggingface_hub applies
  them), ``manifest_text`` / ``manifest_digest`` and ``build_manifest`` (select, refuse an empty
  result, digest).
"""

import os

# Read by huggingface_hub once, at import: set before anything here imports it.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from gpustack_models.sources.hub_errors import (
    AccessDenied,
    EmptyManifest,
    Failure,
    InvalidManifest,
    RevisionNotFound,
    SourceError,
    SourceUnavailable,
)
from gpustack_models.sources.manifest import (
    InvalidPath,
    ManifestFile,
    ResolvedRevision,
    build_manifest,
    manifest_digest,
    manifest_text,
    select_files,
    validate_path,
)

__all__ = [
    "AccessDenied",
    "EmptyManifest",
    "Failure",
    "InvalidManifest",
    "InvalidPath",
    "ManifestFile",
    "ResolvedRevision",
    "RevisionNotFound",
    "SourceError",
    "SourceUnavailable",
    "build_manifest",
    "manifest_digest",
    "manifest_text",
    "select_files",
    "validate_path",
]
