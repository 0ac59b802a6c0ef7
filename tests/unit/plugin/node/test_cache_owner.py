"""The init container's hand-over of the cache to the non-root user (run as root here, as it runs)."""

from __future__ import annotations

import os

from gpustack_models.plugin.node.cache_owner import main

USER = 10001


def owners(root) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames + ([""] if dirpath == str(root) else []):
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.lstat(path).st_uid
    return out


def test_it_hands_over_what_root_wrote_never_following_links_and_again_changes_nothing(tmp_path, capsys):
    cache = tmp_path / "cache"
    (cache / "models" / "ab").mkdir(parents=True)
    (cache / "models" / "ab" / "weights").write_bytes(b"w")
    os.chmod(cache / "models" / "ab", 0o700)  # root's own, read as its owner
    host = tmp_path / "host-file"
    host.write_text("root's")
    (cache / "link").symlink_to(host)
    assert main([f"{USER}:{USER}", str(cache), str(tmp_path / "plugin" / "node-a")]) == 0
    assert set(owners(cache).values()) == {USER} and os.lstat(tmp_path / "plugin" / "node-a").st_uid == USER
    assert os.stat(host).st_uid == 0, "a link was followed"
    capsys.readouterr()
    assert main([f"{USER}:{USER}", str(cache)]) == 0
    assert "0 entries handed" in capsys.readouterr().out


def test_it_refuses_a_missing_owner(capsys):
    assert main(["/var/lib/x"]) == 2
