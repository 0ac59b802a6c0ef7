"""Writing a private file (a key, a certificate beside it): mode 0600 from its first byte, synced, and
replacing the old one in one rename, so a reader sees the old file or the new one, whole. The API (its own
client certificate) and the node plugin (the certificates the API issues it) both write their keys so."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path``, mode 0600 from the start, replacing it in one rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
