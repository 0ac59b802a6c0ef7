"""When a file changed: its inode, modification time and size, which a rename into place (a rotated Secret,
a renewed certificate) or a rewrite alters. The API's plugin CA, its CA ConfigMap publisher and the plugin's
client certificate each reload their files when these move."""

from __future__ import annotations

import os


def file_stamps(*paths: str | os.PathLike) -> tuple:
    """Per path, ``(inode, mtime_ns, size)``, or ``None`` for a file that cannot be read."""
    stamps = []
    for path in paths:
        try:
            info = os.stat(path)
            stamps.append((info.st_ino, info.st_mtime_ns, info.st_size))
        except (OSError, ValueError):
            stamps.append(None)
    return tuple(stamps)
