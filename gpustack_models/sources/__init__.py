"""The hub side of resolution: from a repository at a revision to a commit and a manifest digest.

No Django and no Kubernetes here: callers pass the endpoint, token, proxy and CA bundle explicitly.

- ``huggingface.resolve`` / ``modelscope.resolve`` -> ``Resolution(commit, files, pinned, note)`` or
  ``SourceError`` (``pinned`` False: the hub named no commit, see ``Resolution``);
- ``manifest``: ``ManifestFile``, ``select_files`` (the patterns, exactly as huggingface_hub applies
  them), ``manifest_text`` / ``manifest_digest`` and ``build_manifest`` (select, refuse an empty
  result, digest).
"""

import os

# Read by huggingface_hub once, at import: set before anything here imports it.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from gpustack_models.sources.manifest import (
    InvalidPath,
    ManifestFile,
    Resolution,
    build_manifest,
    manifest_digest,
    manifest_text,
    select_files,
    validate_path,
)
from gpustack_models.sources.resolution_errors import (
    AccessDenied,
    EmptyManifest,
    InvalidManifest,
    RevisionNotFound,
    SourceError,
    SourceUnavailable,
)

__all__ = [
    "AccessDenied",
    "EmptyManifest",
    "InvalidManifest",
    "InvalidPath",
    "ManifestFile",
    "Resolution",
    "RevisionNotFound",
    "SourceError",
    "SourceUnavailable",
    "build_manifest",
    "manifest_digest",
    "manifest_text",
    "select_files",
    "validate_path",
]
