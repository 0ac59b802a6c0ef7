"""The ``files`` subresource of a ModelArtifact: the files its content is made of, as resolved.

``kubectl get mart NAME --subresource=files`` prints one row per file (path, size, and with ``-o wide`` the
digest each file is verified against); ``-o json`` gives the object. It is the resolved manifest the service
recorded once for the content's digest (the same list every node downloads and verifies), read with the
same ``get`` on ``modelartifacts/files`` as any other subresource; an artifact not resolved yet, or on a
claim, lists no file and says why in ``reason``.
"""

from __future__ import annotations

from gpustack_models.api.progress import ProgressView
from gpustack_models.api.renderers import FILES_RENDERERS
from gpustack_models.kinds import GROUP, PUBLIC_VERSION
from gpustack_models.models import Manifest


def listing(name: str, namespace: str, artifact: dict) -> dict:
    """The ``ModelArtifactFiles`` answer for ``artifact`` (a storage object)."""
    spec, status = artifact.get("spec") or {}, artifact.get("status") or {}
    resolved = status.get("resolved") or {}
    out = {
        "kind": "ModelArtifactFiles",
        "apiVersion": f"{GROUP}/{PUBLIC_VERSION}",
        "metadata": {"name": name, "namespace": namespace},
        "manifestDigest": resolved.get("manifestDigest") or "",
        "files": [],
    }
    if "persistentVolumeClaim" in (spec.get("source") or {}):
        return dict(out, reason="ClaimSource")
    manifest = Manifest.objects.filter(digest=out["manifestDigest"]).first() if out["manifestDigest"] else None
    if manifest is None:
        return dict(out, reason="NotResolved")
    out["files"] = [
        {"path": f["path"], "sizeBytes": f["size"], "digest": f"{f['algorithm']}:{f['hexdigest']}"}
        for f in manifest.files
    ]
    return out


class FilesView(ProgressView):
    """``GET .../namespaces/<ns>/modelartifacts/<name>/files``: needs ``get`` on ``modelartifacts/files``.

    Answers the object, or a Table of one row per file (``kubectl get mart <name> --subresource=files``)."""

    renderer_classes = list(FILES_RENDERERS)
    subresource = "files"

    def answer(self, artifact: dict) -> dict:
        return listing(self.target.name, self.target.namespace, artifact)
