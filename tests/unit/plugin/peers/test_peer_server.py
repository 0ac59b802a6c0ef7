"""The pure parts of the peer server: what a request may ask for (Range, file path), the tree it lists, and
its upload limits: what the plugin makes of a store's spec (its own settings for what is missing), the
slots of transfers in flight, and applying new limits while transfers run."""

import pytest

from gpustack_models.plugin.peers.peer_server import (
    Refused,
    UploadLimits,
    check_path,
    connection_limits,
    list_tree,
    parse_range,
    set_upload_limits,
    upload_limits,
)

SIZE = 1000
OWN = (3, 5000)  # the plugin's GPUSTACK_PLUGIN_PEER_MAX_CONNECTIONS, GPUSTACK_PLUGIN_PEER_MAX_BYTES_PER_SECOND


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"upload": {"connections": 1, "bytesPerSecond": 1_000_000}}, (1, 1_000_000)),
        ({"upload": {"connections": 1024, "bytesPerSecond": 0}}, (1024, 0)),
        ({"upload": {"connections": 2}}, (2, 5000)),  # a field left out: the plugin's own
        ({"upload": {"bytesPerSecond": 0}}, (3, 0)),
        ({"upload": {}}, OWN),
        ({}, OWN),  # a worker that writes no upload limits
        (None, OWN),
        ({"upload": None}, OWN),
        ({"upload": [1, 2]}, OWN),
        ({"upload": {"connections": 0, "bytesPerSecond": -1}}, OWN),  # outside the schema's bounds
        ({"upload": {"connections": 1025, "bytesPerSecond": 2**63}}, OWN),
        ({"upload": {"connections": "2", "bytesPerSecond": "10"}}, OWN),
        ({"upload": {"connections": True, "bytesPerSecond": False}}, OWN),
        ({"upload": {"connections": 2.0, "bytesPerSecond": 1.5}}, OWN),
    ],
)
def test_the_plugin_reads_its_upload_limits_from_the_spec_and_keeps_its_own_for_the_rest(spec, expected):
    assert upload_limits(spec, OWN) == expected


def test_new_limits_apply_to_new_transfers_while_running_ones_go_on():
    uploads = UploadLimits(2, 0)
    assert uploads.try_acquire() and uploads.try_acquire()
    assert set_upload_limits(uploads, None, 1, 1000) is True
    assert set_upload_limits(uploads, None, 1, 1000) is False  # nothing changed: nothing to tell
    assert (uploads.limit, uploads.rate.bytes_per_second) == (1, 1000)
    uploads.release()
    assert not uploads.try_acquire()  # one still runs: at the new limit
    uploads.release()
    assert uploads.try_acquire() and not uploads.try_acquire()
    assert set_upload_limits(uploads, None, 3, 0) is True
    assert uploads.try_acquire() and uploads.try_acquire() and not uploads.try_acquire()


def test_the_peer_server_holds_more_connections_than_transfers():
    assert connection_limits(1).connections == 128
    assert connection_limits(1024).connections == 4096


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
