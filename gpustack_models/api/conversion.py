"""Conversion between the public ``v1`` and the storage ``v1alpha1``.

The storage objects are ``worker.gpustack.ai/v1alpha1``; the public version is ``v1``. The schemas are the
same, so conversion is the apiVersion: of the object, of list items, of watch events, of managedFields
entries and ownerReferences, and inside kubectl's last-applied annotation (server-side apply keeps it in
step with what it received, which is the storage version).

Answers from kube-apiserver are rewritten as bytes, without decoding them: its JSON encoder writes the
pair ``"apiVersion":"worker.gpustack.ai/v1alpha1"`` only where a key ``apiVersion`` holds exactly that value,
and in this group's schemas that is always an API version (labels cannot hold a ``/``). The one text that
would be rewritten too is an annotation whose key is ``apiVersion`` with that exact value.

Errors the storage answers (``Status``) never name the storage version either: a user of v1 reads about
v1 (``public_status_bytes``).
"""

from __future__ import annotations

from gpustack_models.kinds import GROUP, PUBLIC_VERSION, STORAGE_VERSION

PUBLIC = f"{GROUP}/{PUBLIC_VERSION}"
STORAGE = f"{GROUP}/{STORAGE_VERSION}"

# (storage form, public form): compact, indented (?pretty=true) and escaped inside a JSON string.
_PAIRS = [
    (f'"apiVersion":"{STORAGE}"'.encode(), f'"apiVersion":"{PUBLIC}"'.encode()),
    (f'"apiVersion": "{STORAGE}"'.encode(), f'"apiVersion": "{PUBLIC}"'.encode()),
    (f'\\"apiVersion\\":\\"{STORAGE}\\"'.encode(), f'\\"apiVersion\\":\\"{PUBLIC}\\"'.encode()),
]


def public_bytes(data: bytes) -> bytes:
    """Storage JSON from kube-apiserver (object, list, watch event) as v1 JSON."""
    for storage, public in _PAIRS:
        if storage in data:
            data = data.replace(storage, public)
    return data


def _swap(obj: dict, source: str, target: str) -> dict:
    if obj.get("apiVersion") == source:
        obj["apiVersion"] = target
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        for key in ("managedFields", "ownerReferences"):
            entries = metadata.get(key)
            for entry in entries if isinstance(entries, list) else ():
                if isinstance(entry, dict) and entry.get("apiVersion") == source:
                    entry["apiVersion"] = target
        annotations = metadata.get("annotations")
        last_applied = "kubectl.kubernetes.io/last-applied-configuration"
        if isinstance(annotations, dict) and isinstance(annotations.get(last_applied), str):
            annotations[last_applied] = annotations[last_applied].replace(
                f'"apiVersion":"{source}"', f'"apiVersion":"{target}"', 1
            )
    return obj


def to_storage(obj: dict) -> dict:
    """Rewrite a v1 request body (in place) to the storage version."""
    return _swap(obj, PUBLIC, STORAGE)


# In a Status message the storage version appears as a group/version ("... using worker.gpustack.ai/v1alpha1")
# or as a bare version ('ModelArtifact in version "v1alpha1" cannot be handled ...').
_STATUS_TEXT = [(STORAGE, PUBLIC), (f'version "{STORAGE_VERSION}"', f'version "{PUBLIC_VERSION}"')]


def public_text(text):
    """Text from the storage (an error message) as the v1 API tells it."""
    if not isinstance(text, str):
        return text
    for storage, public in _STATUS_TEXT:
        text = text.replace(storage, public)
    return text


def public_status(status: dict) -> dict:
    """A ``Status`` from the storage as the v1 API tells it: its message and its causes' messages."""
    out = dict(status, message=public_text(status.get("message")))
    details = out.get("details")
    if isinstance(details, dict) and isinstance(details.get("causes"), list):
        causes = details["causes"]
        out["details"] = dict(details, causes=[_public_cause(c) for c in causes])
    return out


def _public_cause(cause):
    return dict(cause, message=public_text(cause.get("message"))) if isinstance(cause, dict) else cause
