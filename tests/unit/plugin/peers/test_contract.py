"""The peers' contract: the ranges a peer has, the peer URLs, and the token file a plugin shows its peers."""

import os

import pytest

from gpustack_models.plugin.peers.contract import FileToken, PeerTokenUnavailable, covers, file_url, tree_url


def test_it_says_whether_a_peer_has_a_range():
    have = [[0, 100], [200, 300]]
    assert covers(have, 0, 100) and covers(have, 250, 300) and covers(have, 50, 50)
    assert not covers(have, 90, 210) and not covers(have, 100, 101) and not covers([], 0, 1)


def test_it_builds_the_peer_urls():
    digest = "sha256:" + "ab" * 32
    assert tree_url("https://10.0.0.1:8444/", digest) == f"https://10.0.0.1:8444/peer/v1/trees/{'ab' * 32}"
    assert file_url("https://10.0.0.1:8444", digest, "a b/c#d.bin").endswith(f"{'ab' * 32}/files/a%20b/c%23d.bin")
    with pytest.raises(ValueError):
        tree_url("https://10.0.0.1:8444", "sha256:../x")


def test_it_reads_the_peer_token_file_again_when_it_is_rotated(tmp_path):
    path = tmp_path / "token"
    token = FileToken(path)
    with pytest.raises(PeerTokenUnavailable):
        token()
    path.write_text("first\n")
    assert token() == "first" and token.headers() == {"Authorization": "Bearer first"}
    rotated = tmp_path / "token.new"
    rotated.write_text("second")
    os.replace(rotated, path)  # as the kubelet swaps a projected volume's files
    assert token() == "second"
    path.write_text("")
    with pytest.raises(PeerTokenUnavailable):
        token()
