"""The pure parts of the peer endpoints: what a request may ask for (Range, file path), the ranges a peer
has, the ticket's peers, the token file a plugin shows its peers, and the upload slots."""

import os

import pytest

from gpustack_models.plugin.engine import FetchTicket
from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.ticket import PeerSource
from gpustack_models.plugin.peers.contract import FileToken, PeerTokenUnavailable, covers, file_url, tree_url
from gpustack_models.plugin.peers.peer_server import Refused, UploadLimits, check_path, list_tree, parse_range
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

SIZE = 1000


@pytest.mark.parametrize(
    "header, expected",
    [
        (None, None),
        ("bytes=0-0", (0, 1)),
        ("bytes=10-19", (10, 20)),
        ("bytes=990-", (990, 1000)),
        ("bytes=-10", (990, 1000)),
        ("bytes=-5000", (0, 1000)),
        ("bytes=0-99999", (0, 1000)),
        (" bytes=1-2 ", (1, 3)),
    ],
)
def test_it_reads_one_range(header, expected):
    assert parse_range(header, SIZE) == expected


@pytest.mark.parametrize(
    "header", ["bytes=5-3", "bytes=0-1,5-6", "items=0-1", "bytes=-", "bytes=a-b", "bytes 0-1", "bytes=0x1-2", ""]
)
def test_it_refuses_malformed_ranges_with_400(header):
    with pytest.raises(Refused) as refused:
        parse_range(header, SIZE)
    assert refused.value.code == 400


@pytest.mark.parametrize("header, size", [("bytes=1000-", SIZE), ("bytes=5000-6000", SIZE), ("bytes=-0", SIZE),
                                          ("bytes=0-0", 0), ("bytes=-1", 0)])  # fmt: skip
def test_it_answers_416_outside_the_file(header, size):
    with pytest.raises(Refused) as refused:
        parse_range(header, size)
    assert refused.value.code == 416 and refused.value.headers == {"Content-Range": f"bytes */{size}"}


@pytest.mark.parametrize("path", ["a.bin", "dir/a.bin", "a b/c..d", ".hidden/x", "..a"])
def test_it_takes_plain_relative_paths(path):
    assert check_path(path) == path


@pytest.mark.parametrize("path", ["", "/etc/passwd", "..", "../x", "a/../b", "a//b", "./a", "a/.", "a/", "a\x00b"])
def test_it_refuses_paths_that_could_leave_the_tree(path):
    with pytest.raises(Refused) as refused:
        check_path(path)
    assert refused.value.code == 400


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


def ticket_with(peers):
    files = [ManifestFile("a.bin", 3, "sha256", "0" * 64, True)]
    return FetchTicket(
        digest=manifest_digest(files),
        source="huggingFace",
        endpoint="https://hub.example",
        repository="org/model",
        commit="c" * 40,
        files=files,
        peers=peers,
    )


def test_it_carries_peers_in_the_ticket():
    data = ticket_with([]).to_dict()
    data["peers"] = [
        {"node": "node-a", "url": "https://10.0.0.1:8444", "state": "Ready"},
        {"node": "node-b", "url": "https://[fd00::1]:8444/", "state": "Downloading"},
    ]
    ticket = FetchTicket.from_dict(data).validate()
    assert ticket.peers == (
        PeerSource("node-a", "https://10.0.0.1:8444", "Ready"),
        PeerSource("node-b", "https://[fd00::1]:8444", "Downloading"),
    )
    assert FetchTicket.from_dict(ticket.to_dict()).peers == ticket.peers
    assert FetchTicket.from_dict(ticket_with([]).to_dict()).peers == ()


@pytest.mark.parametrize(
    "peer",
    [
        {"node": "node-a", "url": "http://10.0.0.1:8444"},
        {"node": "node-a", "url": "https://10.0.0.1"},
        {"node": "node-a", "url": "https://:8444"},
        {"node": "node-a", "url": "https://10.0.0.1:99999"},
        {"node": "node-a", "url": "https://10.0.0.1:8444/peer"},
        {"node": "node-a", "url": "https://u:p@10.0.0.1:8444"},
        {"node": "node-a", "url": "https://10.0.0.1:8444?x=1"},
        {"node": "Node_A", "url": "https://10.0.0.1:8444"},
        {"node": "node-a", "url": "https://10.0.0.1:8444", "state": "Failed"},
        {"node": "node-a", "url": 7},
    ],
)
def test_it_refuses_a_ticket_with_an_unusable_peer(peer):
    data = dict(ticket_with([]).to_dict(), peers=[peer])
    with pytest.raises(DownloadFailed) as failed:
        FetchTicket.from_dict(data).validate()
    assert failed.value.reason == "InvalidRequest"


def test_it_refuses_a_malformed_peer_entry():
    with pytest.raises(DownloadFailed):
        FetchTicket.from_dict(dict(ticket_with([]).to_dict(), peers=[{"url": "https://10.0.0.1:8444"}]))


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


def test_it_bounds_the_transfers_in_flight():
    limits = UploadLimits(2, 1000)
    assert limits.try_acquire() and limits.try_acquire() and not limits.try_acquire()
    limits.release()
    assert limits.try_acquire() and limits.in_use == 2
    limits.set(3, 0)
    assert limits.try_acquire() and limits.rate.bytes_per_second == 0


def test_it_lists_a_tree_in_manifest_order_without_following_links(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.bin").write_bytes(b"12345")
    (tmp_path / "a.json").write_bytes(b"{}")
    (tmp_path / "B.txt").write_bytes(b"")
    (tmp_path / "link").symlink_to("/etc")
    (tmp_path / "b" / "passwd").symlink_to("/etc/passwd")
    assert list_tree(tmp_path) == [("B.txt", 0), ("a.json", 2), ("b/x.bin", 5)]
