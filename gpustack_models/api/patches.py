"""What a PATCH of a v1 NodeModelStore may change: what the garbage collector writes, nothing else.

NodeModelStores are the service's (spec) and their node plugin's (status); v1 lets anyone with RBAC read
and delete them. The garbage collector still has to finish foreground and orphan deletions by patching
``metadata.finalizers`` (and ``ownerReferences``) on the preferred version, so such a patch is applied
here to the current object and, when nothing else changes, sent to the storage as a merge patch of just
those fields, guarded by the object's resourceVersion.
"""

from __future__ import annotations

import copy

import jsonpatch

from gpustack_models.kube.errors import Invalid, MethodNotAllowed

PATCHABLE_METADATA = ("finalizers", "ownerReferences")
IGNORED_METADATA = ("resourceVersion", "managedFields", "generation")


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch of ``target`` (changed in place where it is a dict)."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = merge_patch(target.get(key), value)
    return target


def patched(before: dict, patch_type: str, patch) -> dict:
    """``before`` with a ``json`` or ``merge`` patch applied (``before`` is left alone)."""
    try:
        if patch_type == "merge":
            return merge_patch(copy.deepcopy(before), patch)
        return jsonpatch.apply_patch(before, patch)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, ValueError) as exc:
        raise Invalid(f"the patch could not be applied: {exc}") from None


def without_patchable(obj: dict) -> dict:
    out = copy.deepcopy(obj)
    metadata = out.get("metadata") or {}
    for key in PATCHABLE_METADATA + IGNORED_METADATA:
        metadata.pop(key, None)
    return out


def garbage_collector_patch(before: dict, patch_type: str, patch) -> dict:
    """The guarded merge patch that makes ``before`` what ``patch`` asks, if it touches only finalizers
    and ownerReferences; ``MethodNotAllowed`` otherwise (an apply patch included)."""
    if patch_type == "apply":
        raise MethodNotAllowed("nodemodelstores accept no apply patch: the service owns them")
    after = patched(before, patch_type, patch)
    if without_patchable(after) != without_patchable(before):
        raise MethodNotAllowed(
            "nodemodelstores can only be read and deleted; a patch may change nothing but "
            "metadata.finalizers and metadata.ownerReferences"
        )
    meta_after = after.get("metadata") or {}
    guarded = {"metadata": {"resourceVersion": before["metadata"]["resourceVersion"]}}
    for key in PATCHABLE_METADATA:
        guarded["metadata"][key] = meta_after.get(key)
    return guarded
