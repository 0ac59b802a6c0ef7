"""Hands the node's cache and the plugin's state to the non-root user that downloads: the plugin Pod's
init container, ``python -m gpustack_models.plugin.node.cache_owner UID:GID DIR...``.

It runs as root with ``CAP_CHOWN`` only (no ``CAP_DAC_OVERRIDE``: it reads what root owns, as its owner).
Each directory is made if missing, then its content handed over depth first and the directory itself
last, so a directory the user owns already is skipped whole: everything below it was handed over before
it, or made by the user since. Symbolic links are changed themselves, never followed. Files an earlier
plugin wrote as root (before the Pod was split) are the ones handed over; a second start changes nothing.
"""

from __future__ import annotations

import os
import stat
import sys


def hand_over(path: str, uid: int, gid: int) -> int:
    """Give ``path`` and what is below it to ``uid:gid``; how many entries changed."""
    st = os.lstat(path)
    if (st.st_uid, st.st_gid) == (uid, gid):
        return 0
    changed = 0
    if stat.S_ISDIR(st.st_mode):
        with os.scandir(path) as entries:
            for entry in entries:
                changed += hand_over(entry.path, uid, gid)
    os.lchown(path, uid, gid)
    return changed + 1


def main(argv: list[str]) -> int:
    if len(argv) < 2 or ":" not in argv[0]:
        print("usage: cache_owner UID:GID DIR...", file=sys.stderr)
        return 2
    uid, gid = (int(n) for n in argv[0].split(":", 1))
    for directory in argv[1:]:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        print(f"{directory}: {hand_over(directory, uid, gid)} entries handed to {uid}:{gid}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
