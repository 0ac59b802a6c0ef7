"""Paths opened without following symbolic links, and mounts made on the very directories opened.

A path checked and then mounted on by name can be swapped for a symbolic link in between (the mount
then lands on the link's destination). Here a path is opened once, component by component from a
trusted directory, refusing every symbolic link and every escape (``openat2`` with
``RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH``, Linux 5.6+; a walk with ``O_NOFOLLOW`` elsewhere), and the
mount is made through the descriptors: ``mount(2)`` resolves ``/proc/self/fd/N`` to the inode opened,
whatever the name leads to meanwhile.

The read-only bind mount is made with the mount API of Linux 5.12+ (``open_tree`` a clone of the
source, ``mount_setattr`` read-only, nosuid, nodev, then ``move_mount`` onto the target): it is never
visible writable. Older kernels bind, then remount read-only the mount found again beneath the parent
(checked to show the source before it is touched).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
MNT_DETACH = 2

# The same numbers on x86_64 and aarch64 (the syscalls added since 5.x share one table).
_SYSCALLS = {"open_tree": 428, "move_mount": 429, "openat2": 437, "mount_setattr": 442}
_ARCHES = {"x86_64", "aarch64", "arm64"}
RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH = 0x04, 0x08
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH, MOVE_MOUNT_T_EMPTY_PATH = 0x04, 0x40
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x01, 0x02, 0x04
UMOUNT_NOFOLLOW = 8
DIRECTORY = os.O_PATH | os.O_DIRECTORY

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_missing: set[str] = set()  # syscalls this kernel answered ENOSYS to


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def fd_path(fd: int) -> str:
    """The magic link of ``fd``: what ``mount(2)`` and ``open(2)`` resolve to the file opened."""
    return f"/proc/self/fd/{fd}"


def where(fd: int) -> str:
    """The path ``fd`` was reached by, as the kernel tells it now."""
    return os.readlink(fd_path(fd))


def _syscall(name: str, *args) -> int | None:
    """The syscall's result; ``None`` when this kernel or architecture has not got it."""
    if name in _missing or platform.machine() not in _ARCHES:
        return None
    result = _libc.syscall(ctypes.c_long(_SYSCALLS[name]), *args)
    if result >= 0:
        return result
    code = ctypes.get_errno()
    if code == errno.ENOSYS:
        _missing.add(name)
        return None
    raise OSError(code, f"{name}: {os.strerror(code)}")


def open_beneath(dir_fd: int, relative: str, flags: int = DIRECTORY) -> int:
    """Open ``relative`` beneath ``dir_fd``: ``ELOOP`` when any component is a symbolic link, ``EXDEV``
    when it climbs out (``..``, an absolute path). The descriptor is close-on-exec."""
    if not relative or os.path.isabs(relative) or ".." in relative.split("/"):
        raise OSError(errno.EXDEV, f"{relative!r} is not a path beneath its directory")
    how = _OpenHow(flags | os.O_CLOEXEC, 0, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)
    path = relative.encode()
    fd = _syscall(
        "openat2", ctypes.c_int(dir_fd), ctypes.c_char_p(path), ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how))
    )
    if fd is None:
        return _walk(dir_fd, relative, flags)
    if stat.S_ISLNK(os.fstat(fd).st_mode):  # O_PATH | O_NOFOLLOW opens a trailing link itself
        os.close(fd)
        raise OSError(errno.ELOOP, f"{relative!r} is a symbolic link")
    return fd


def _walk(dir_fd: int, relative: str, flags: int) -> int:
    """``open_beneath`` without ``openat2``: one ``O_NOFOLLOW`` open per component."""
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    fd = os.dup(dir_fd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            opened = os.open(part, (flags if last else DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = opened
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(errno.ELOOP, f"{part!r} is a symbolic link")
        out, fd = fd, -1
        return out
    finally:
        if fd >= 0:
            os.close(fd)


def _mount(source: str | None, target: str, flags: int) -> None:
    if _libc.mount(source.encode() if source else None, target.encode(), None, flags, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount on {target}: {os.strerror(code)}")


def bind_read_only(source_fd: int, target_fd: int, parent_fd: int, name: str) -> None:
    """Bind the directory ``source_fd`` read-only (nosuid, nodev) on the directory ``target_fd``, which
    is ``name`` in ``parent_fd``."""
    tree = _syscall("open_tree", ctypes.c_int(source_fd), ctypes.c_char_p(b""),
                    ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH))  # fmt: skip
    if tree is None:
        _bind_then_remount(source_fd, target_fd, parent_fd, name)
        return
    try:
        attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
        set_attr = _syscall("mount_setattr", ctypes.c_int(tree), ctypes.c_char_p(b""), ctypes.c_uint(AT_EMPTY_PATH),
                            ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))  # fmt: skip
        if set_attr is None:  # 5.2 to 5.11: open_tree without mount_setattr
            _bind_then_remount(source_fd, target_fd, parent_fd, name)
            return
        _syscall("move_mount", ctypes.c_int(tree), ctypes.c_char_p(b""), ctypes.c_int(target_fd), ctypes.c_char_p(b""),
                 ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH))  # fmt: skip
    finally:
        os.close(tree)


def _bind_then_remount(source_fd: int, target_fd: int, parent_fd: int, name: str) -> None:
    """Bind through the descriptors, then remount read-only the mount ``name`` now shows, once it is
    checked to be the source's; otherwise (the name swapped meanwhile) the bind is detached, never
    remounted."""
    _mount(fd_path(source_fd), fd_path(target_fd), MS_BIND)
    try:
        root = open_beneath(parent_fd, name)
    except OSError:
        _detach_stray(target_fd)
        raise
    try:
        shown, source = os.fstat(root), os.fstat(source_fd)
        if (shown.st_dev, shown.st_ino) != (source.st_dev, source.st_ino):
            _detach_stray(target_fd)
            raise OSError(errno.EXDEV, f"{name} was replaced while it was mounted on")
        try:
            _mount(None, fd_path(root), MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except OSError:
            _libc.umount2(fd_path(root).encode(), MNT_DETACH)
            raise
    finally:
        os.close(root)


def _detach_stray(target_fd: int) -> None:
    """Detach the bind made on ``target_fd``'s directory after its name was swapped (a mount is reached
    by path only: by where the directory is now)."""
    _libc.umount2(where(target_fd).encode(), MNT_DETACH | UMOUNT_NOFOLLOW)


def unmount_at(parent_fd: int, name: str) -> None:
    """Unmount ``name`` in ``parent_fd`` (never following a symbolic link there); lazily when it is busy
    (the content is read-only and stays protected)."""
    path = f"{fd_path(parent_fd)}/{name}".encode()
    if _libc.umount2(path, UMOUNT_NOFOLLOW) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EBUSY and _libc.umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) == 0:
        return
    code = ctypes.get_errno() if code == errno.EBUSY else code
    raise OSError(code, f"unmount {name}: {os.strerror(code)}")
