"""The one definition of each resource kind of ``worker.gpustack.ai``.

``modelartifact``, ``nodemodelstore`` and ``modelprefetch`` each define one ``ResourceKind``; the storage
CRDs (``crd``), the v1 API's discovery, OpenAPI and Tables, and the validation of both versions are all
derived from these three objects, so they cannot drift apart.
"""

from gpustack_models.kinds.base import CATEGORY, GROUP, PUBLIC_VERSION, STORAGE_VERSION, Column, Field, ResourceKind
from gpustack_models.kinds.modelartifact import FILES_COLUMNS, MODEL_ARTIFACT, PROGRESS_COLUMNS
from gpustack_models.kinds.modelprefetch import MODEL_PREFETCH
from gpustack_models.kinds.nodemodelstore import FAILURE_REASONS, MODEL_STATES, NODE_MODEL_STORE

KINDS: tuple[ResourceKind, ...] = (MODEL_ARTIFACT, NODE_MODEL_STORE, MODEL_PREFETCH)
BY_PLURAL = {k.plural: k for k in KINDS}
BY_KIND = {k.kind: k for k in KINDS}

__all__ = [
    "BY_KIND",
    "BY_PLURAL",
    "CATEGORY",
    "FAILURE_REASONS",
    "GROUP",
    "KINDS",
    "MODEL_ARTIFACT",
    "MODEL_PREFETCH",
    "MODEL_STATES",
    "NODE_MODEL_STORE",
    "FILES_COLUMNS",
    "PROGRESS_COLUMNS",
    "PUBLIC_VERSION",
    "STORAGE_VERSION",
    "Column",
    "Field",
    "ResourceKind",
]
