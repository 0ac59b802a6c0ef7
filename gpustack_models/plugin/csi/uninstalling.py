"""The mounter when the release is uninstalled: unmount the Pods still using models, then go.

The kubelet tears a CSI volume down through its driver and treats a missing driver as transient: once the
plugin's DaemonSet is deleted, a Pod still mounting a model would stay Terminating forever (and its
namespace with it). The uninstall hook therefore annotates each plugin Pod ``worker.gpustack.ai/uninstalling:
"true"``; the mounter reads its Pod's annotations from a downwardAPI volume when it is stopped and, if marked,
keeps serving NodeUnpublish until its node has no publication left (bounded by the Pod's
terminationGracePeriodSeconds), optionally deletes the node's cache, then exits. A rolling update marks
nothing: the mounter stops at once and the mounts stay for its successor.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

UNINSTALLING = "worker.gpustack.ai/uninstalling"
POLL_SECONDS = 1.0


def pod_annotations(path: str) -> dict[str, str]:
    """The annotations in a downwardAPI file (``key="quoted value"`` per line); none if it is unreadable."""
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    annotations = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            annotations[key] = json.loads(value)
        except ValueError:
            annotations[key] = value
    return annotations


def uninstalling(path: str) -> bool:
    return bool(path) and pod_annotations(path).get(UNINSTALLING) == "true"


def drain(published: Callable[[], set]) -> None:
    """Wait until ``published()`` is empty: the CSI servers keep answering NodeUnpublish meanwhile."""
    left = published()
    log.info("uninstalling: serving NodeUnpublish until no publication is left (%d now)", len(left))
    idle = threading.Event()  # never set: the kubelet's SIGKILL ends a drain that outlives the grace period
    while left:
        idle.wait(POLL_SECONDS)
        left = published()
    log.info("uninstalling: no publication left")


def purge(*directories: str) -> None:
    """Delete what ``directories`` hold (the node's cache and mount records), keeping the directories."""
    for directory in directories:
        root = Path(directory)
        if not directory or not root.is_dir() or root == Path(root.anchor):
            continue
        for entry in root.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        log.info("uninstalling: purged %s", os.fspath(root))
