import hashlib
import pickle

import pytest

from gpustack_models.plugin.engine.hashing import FileHash, resumable_available
from tests.plugin.conftest import random_bytes


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_it_has_resumable_hashes_here():
    # The node image ships OpenSSL; without it downloads still work but re-read on resume.
    assert resumable_available()


@pytest.mark.parametrize("algorithm", ["sha256", "gitsha1"])
def test_it_continues_a_hash_from_a_saved_state(algorithm):
    data = random_bytes(3 * 1024 * 1024 + 17, seed=1)
    expected = hashlib.sha256(data).hexdigest() if algorithm == "sha256" else git_blob(data)
    for cut in (0, 1, 63, 64, 65, 1_000_003, len(data)):
        h = FileHash(algorithm, len(data))
        h.update(data[:cut])
        state = h.state()
        assert isinstance(state, str) and state.isascii()
        # Through a pickle and a fresh object, as across processes.
        restored = FileHash.restore(algorithm, len(data), pickle.loads(pickle.dumps(state)))
        restored.update(bytearray(data[cut:]))
        assert restored.hexdigest() == expected, cut


def test_it_hashes_bytes_bytearrays_and_memoryviews_alike():
    data = random_bytes(200_000, seed=2)
    buf = bytearray(data)
    h = FileHash("sha256", len(data))
    h.update(data[:1000])
    h.update(memoryview(buf)[1000:150_000])
    h.update(memoryview(data)[150_000:])  # read-only view
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("resumable", [True, False], ids=["openssl", "hashlib"])
@pytest.mark.parametrize("algorithm", ["sha256", "gitsha1"])
def test_it_leaves_the_running_hash_alone_when_the_digest_is_read(algorithm, resumable):
    data = random_bytes(10_000, seed=4)
    header = b"" if algorithm == "sha256" else b"blob %d\0" % len(data)
    new = hashlib.sha256 if algorithm == "sha256" else hashlib.sha1
    h = FileHash(algorithm, len(data), _resumable=None if resumable else False)
    assert h.resumable == resumable
    h.update(data[:4321])
    state = h.state()

    assert h.hexdigest() == new(header + data[:4321]).hexdigest()  # the digest of the prefix so far
    assert h.state() == state
    h.update(data[4321:])  # updates after reading the digest continue the same hash
    assert h.hexdigest() == new(header + data).hexdigest()


def test_it_refuses_a_state_of_another_algorithm():
    h = FileHash("sha256", 10)
    h.update(b"abc")
    assert FileHash.restore("gitsha1", 10, h.state()) is None
    assert FileHash.restore("sha256", 10, "garbage") is None
    assert FileHash.restore("sha256", 10, None) is None


def test_it_falls_back_to_hashlib_without_resumable_state():
    data = random_bytes(5000, seed=3)
    h = FileHash("gitsha1", len(data), _resumable=False)
    h.update(data)
    assert h.state() is None
    assert h.hexdigest() == git_blob(data)
