"""The CSI Identity and Node services of ``model.csi.gpustack.ai``.

NodePublishVolume: the request is checked (``validation``), the API authorizes the Pod's mount and
names the digest (``mount_client``); a digest Ready in this node's cache is bind-mounted read-only on the
target path, anything else answers UNAVAILABLE with what the node is doing (``progress_text``), and the
kubelet tries again. Publishing the same volume on the same target again succeeds; another volume or
another model already on the target is ALREADY_EXISTS. NodeUnpublishVolume unmounts, removes the target
directory and tells the API (later, in the background, when it cannot be reached). Mounted digests
are held by the engine whatever ``spec.models`` says. Every other RPC is UNIMPLEMENTED.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf import wrappers_pb2

from gpustack_models.plugin.csi import DRIVER_NAME, VENDOR_VERSION, beneath, validation
from gpustack_models.plugin.csi.bind_mounts import MOUNTS, Mounted, MountTable, mount_points
from gpustack_models.plugin.csi.generated import csi_pb2, csi_pb2_grpc
from gpustack_models.plugin.csi.mount_client import MountClient
from gpustack_models.plugin.csi.progress_text import not_ready_message
from gpustack_models.plugin.csi.validation import CsiError, PublishRequest

log = logging.getLogger(__name__)
_READY = "Ready"


def failed_precondition(message: str) -> CsiError:
    return CsiError(grpc.StatusCode.FAILED_PRECONDITION, message)


class Target:
    """A target path's parent directory, held open (``parent_fd``), and the target's ``name`` in it."""

    def __init__(self, parent_fd: int, name: str):
        self.parent_fd, self.name = parent_fd, name
        self.real = os.path.join(beneath.where(parent_fd), name)

    def close(self) -> None:
        os.close(self.parent_fd)

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Driver:
    """What the services do, on the node's engine. ``changed()`` is called when the mounts changed."""

    def __init__(
        self,
        engine,
        node: str,
        api: MountClient,
        kubelet_dir: str | None,
        changed: Callable = None,
        mounts_dir: str | None = None,
    ):
        self.engine, self.node, self.api, self.kubelet_dir = engine, node, api, kubelet_dir or None
        legacy = Path(engine.cache.root) / MOUNTS
        self.table = MountTable(mounts_dir or legacy, engine.cache.tree, legacy)
        self.changed = changed or (lambda: None)
        self._lock = threading.Lock()
        kept = self.table.load()
        self.engine.set_mounted(self.table.digests())
        if kept:
            log.info("%d volume(s) still mounted from before the restart: %s", len(kept), sorted(self.table.digests()))

    # --- target paths ---------------------------------------------------------------------------------
    def open_parent(self, target: str) -> Target:
        """The target's parent opened from the kubelet's real pods directory without following any symbolic
        link (``beneath``): it cannot be swapped for one afterwards. It must exist (the kubelet makes it).
        Without a known kubelet directory, the parent's real path is opened."""
        pods = validation.pods_dir(self.kubelet_dir)
        parent = os.path.dirname(target)
        base = os.path.realpath(pods if pods is not None else parent)
        relative = os.path.relpath(parent, pods) if pods is not None else "."
        try:
            base_fd = os.open(base, beneath.DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise failed_precondition(f"the parent directory of target_path {target!r} does not exist") from None
        try:
            fd = base_fd if relative == "." else beneath.open_beneath(base_fd, relative)
        except FileNotFoundError:
            raise failed_precondition(f"the parent directory of target_path {target!r} does not exist") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                raise validation.invalid(
                    f"target_path {target!r} passes through a symbolic link or leaves the kubelet's pods directory"
                ) from None
            raise
        finally:
            if relative != ".":
                os.close(base_fd)
        opened = Target(fd, os.path.basename(target))
        if pods is not None and not (opened.real + os.sep).startswith(base + os.sep):
            opened.close()
            raise validation.invalid(f"target_path {target!r} resolves outside the kubelet's pods directory")
        return opened

    @staticmethod
    def _prepare(target: Target) -> tuple[int, bool]:
        """The target: an empty directory (made if missing, True then), opened without following a symbolic
        link; refuses anything else."""
        made = True
        try:
            os.mkdir(target.name, 0o750, dir_fd=target.parent_fd)
        except FileExistsError:
            made = False
        try:
            fd = beneath.open_beneath(target.parent_fd, target.name, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                raise failed_precondition(f"target_path {target.real!r} is not an empty directory") from None
            raise
        if os.listdir(fd) or beneath.where(fd) in mount_points():
            os.close(fd)
            raise failed_precondition(f"target_path {target.real!r} is not an empty directory")
        return fd, made

    def open_tree(self, digest: str) -> int:
        """The published tree of ``digest``, opened beneath the cache without following a symbolic link."""
        root = os.path.realpath(self.engine.cache.root)
        root_fd = os.open(root, beneath.DIRECTORY | os.O_CLOEXEC)
        try:
            return beneath.open_beneath(root_fd, os.path.relpath(self.engine.cache.tree(digest), root))
        finally:
            os.close(root_fd)

    # --- NodePublishVolume ----------------------------------------------------------------------------
    def publish(self, request) -> None:
        req = validation.publish_request(request, self.kubelet_dir)
        with self.open_parent(req.target_path) as target:
            self._publish(req, target)

    def _publish(self, req: PublishRequest, target: Target) -> None:
        real = target.real
        with self._lock:
            if self._published_already(req, real):
                return
        grant = self.api.mount(req.volume_id, req.pod, req.artifact, req.expected_digest)
        entry = self.engine.entry(grant.digest)
        if entry is None or entry.state != _READY or self.engine.path(grant.digest) is None:
            raise CsiError(grpc.StatusCode.UNAVAILABLE, not_ready_message(req.artifact, entry))
        with self._lock:
            if self._published_already(req, real, grant.digest):
                return
            self._mount(req, target, grant.digest)
        self.engine.set_mounted(self.table.digests())
        self.engine.touch(grant.digest)
        self.changed()
        log.info("mounted %s (%s/%s) for Pod %s/%s on %s", grant.digest[:19], req.pod.namespace, req.artifact,
                 req.pod.namespace, req.pod.name, req.target_path)  # fmt: skip

    def _published_already(self, req: PublishRequest, real: str, digest: str | None = None) -> bool:
        """True when this volume is already published on the target as asked; ALREADY_EXISTS when the
        target holds another volume or another model. Caller holds the lock."""
        existing = self.table.at_target(req.target_path)
        if existing is None:
            return False
        same = (
            existing.volume_id == req.volume_id
            and (existing.namespace, existing.artifact) == (req.pod.namespace, req.artifact)
            and req.expected_digest in (None, existing.digest)
            and digest in (None, existing.digest)
        )
        if not same:
            raise CsiError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"target_path {req.target_path!r} already has volume {existing.volume_id!r} mounted"
                f" (model {existing.artifact}, {existing.digest[:19]})",
            )
        if not self.table.shows_tree(real, existing.digest):
            log.warning("the mount of %s on %s is gone; mounting it again", existing.volume_id, req.target_path)
            self.table.forget(existing.volume_id, existing.target)
            return False
        self.engine.touch(existing.digest)
        return True

    def _mount(self, req: PublishRequest, target: Target, digest: str) -> None:
        """Record, then bind the tree read-only on the target, both through descriptors opened without
        following a symbolic link. Caller holds the lock."""
        target_fd, made = self._prepare(target)
        mounted = Mounted(req.volume_id, req.target_path, digest, req.artifact, req.pod.namespace, req.pod.name,
                          req.pod.uid)  # fmt: skip
        self.table.add(mounted)
        try:
            source_fd = self.open_tree(digest)
            try:
                beneath.bind_read_only(source_fd, target_fd, target.parent_fd, target.name)
            finally:
                os.close(source_fd)
        except OSError as exc:
            self.table.forget(req.volume_id, req.target_path)
            if made:
                with contextlib.suppress(OSError):  # swapped meanwhile: left as is
                    os.rmdir(target.name, dir_fd=target.parent_fd)
            raise CsiError(grpc.StatusCode.INTERNAL, f"mounting model {req.artifact} failed: {exc}") from None
        finally:
            os.close(target_fd)

    # --- NodeUnpublishVolume --------------------------------------------------------------------------
    def unpublish(self, request) -> None:
        volume_id = validation.volume_id(request.volume_id)
        target = validation.target_path(request.target_path, self.kubelet_dir)
        with self._lock:
            record = self.table.find(volume_id, target)
            try:
                opened = self.open_parent(target)
            except CsiError as exc:
                if exc.code != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                opened = None  # no parent: nothing there
            if opened is not None:
                with opened:
                    self._unmount(opened, record)
            if record is not None:
                self.table.forget(volume_id, target)
            released = not self.table.volume_in_use(volume_id)
        self.engine.set_mounted(self.table.digests())
        self.changed()
        if released:
            self.release(volume_id)

    def _ours(self, shown: os.stat_result, record: Mounted | None) -> bool:
        digests = ([record.digest] if record is not None else []) + self.engine.cache.published_digests()
        for digest in digests:
            try:
                tree = os.lstat(self.engine.cache.tree(digest))  # a link there is no tree of ours
            except OSError:
                continue
            if (tree.st_dev, tree.st_ino) == (shown.st_dev, shown.st_ino):
                return True
        return False

    def _unmount(self, target: Target, record: Mounted | None) -> None:
        """Unmount a tree of this cache from the target and remove the directory; nothing there is fine.
        Caller holds the lock."""
        try:
            fd = beneath.open_beneath(target.parent_fd, target.name, os.O_PATH | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise failed_precondition(f"target_path {target.real!r} is a symbolic link; left as is") from None
            raise
        try:
            shown, mounted = os.fstat(fd), beneath.where(fd) in mount_points()
        finally:
            os.close(fd)
        if mounted:
            if not self._ours(shown, record):
                raise failed_precondition(
                    f"target_path {target.real!r} holds a mount this driver did not make; left as is"
                )
            beneath.unmount_at(target.parent_fd, target.name)
            log.info("unmounted %s", target.real)
        try:
            os.rmdir(target.name, dir_fd=target.parent_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.ENOTDIR, errno.EEXIST):
                message = f"target_path {target.real!r} is not an empty directory; left as is"
                raise failed_precondition(message) from None
            raise

    def release(self, volume_id: str) -> None:
        """Tell the API the volume is gone; remembered and retried (``retry_releases``) if it cannot."""
        try:
            self.api.release(volume_id)
        except CsiError as exc:
            log.warning("the API did not take the release of volume %s yet (%s); retrying later", volume_id,
                        exc.message)  # fmt: skip
            self.table.release_pending(volume_id)
            return
        self.table.release_done(volume_id)

    def retry_releases(self) -> None:
        for volume_id in self.table.released():
            if self.table.volume_in_use(volume_id):
                self.table.release_done(volume_id)  # published again since: the API holds it rightly
            else:
                self.release(volume_id)


def _call(context, action: Callable[[], object]):
    """Run ``action``; a ``CsiError`` is the RPC's status, anything unexpected an INTERNAL one."""
    try:
        return action()
    except CsiError as exc:
        context.abort(exc.code, exc.message)
    except grpc.RpcError:
        raise
    except Exception as exc:
        log.exception("CSI call failed")
        context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")


class IdentityService(csi_pb2_grpc.IdentityServicer):
    def GetPluginInfo(self, request, context):
        return csi_pb2.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=VENDOR_VERSION)

    def GetPluginCapabilities(self, request, context):
        return csi_pb2.GetPluginCapabilitiesResponse()  # a Node service only: no controller

    def Probe(self, request, context):
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))


class NodeService(csi_pb2_grpc.NodeServicer):
    def __init__(self, driver: Driver):
        self.driver = driver

    def NodePublishVolume(self, request, context):
        _call(context, lambda: self.driver.publish(request))
        return csi_pb2.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request, context):
        _call(context, lambda: self.driver.unpublish(request))
        return csi_pb2.NodeUnpublishVolumeResponse()

    def NodeGetCapabilities(self, request, context):
        return csi_pb2.NodeGetCapabilitiesResponse()  # no staging, stats, expansion or mount group

    def NodeGetInfo(self, request, context):
        return csi_pb2.NodeGetInfoResponse(node_id=self.driver.node)
