"""Files inside compressed layers (gzip, zstd), against the suite's real registry: the worker's resolution
records where each file is in the decompressed tar stream, and the download engine reads each layer once from
its start, writing every wanted file (hard links too) byte-identical; a dropped connection goes on from the
compressed byte it reached, a new attempt keeps the files it finished, a corrupted byte publishes nothing, and
a part asked of the registry alone (peers failed it) is read out of its layer."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import socket
import threading
import uuid

import pytest

from gpustack_models.plugin.engine import FAILED, READY, Cache, Download, FetchTicket, Limits
from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.ticket_peers import PeerSource
from gpustack_models.sources import oci
from gpustack_models.sources.manifest import manifest_digest
from tests.plugin.conftest import settings, tree_files, wait_for
from tests.support.oci_images import push_image, tar_layer

MiB = 1024 * 1024
W1 = os.urandom(3 * MiB + 5)  # incompressible, as weights nearly are
W2 = os.urandom(2 * MiB + 3)
FIRST = {  # gzip, two members
    "models/config.json": b'{"hidden_size": 64}',
    "models/w1.bin": W1,
    "models/same.bin": "=>models/w1.bin",
    "models/old.bin": b"removed by the next layer",
    "bin/tool": b"not under the model's path",
}
SECOND = {"models/w2.bin": W2, "models/old.bin": None}  # zstd, two frames
THIRD = {"models/tokenizer.json": b'{"vocab": {}}'}  # uncompressed
EXPECTED = {
    "config.json": FIRST["models/config.json"],
    "w1.bin": W1,
    "same.bin": W1,
    "w2.bin": W2,
    "tokenizer.json": THIRD["models/tokenizer.json"],
}


class Image:
    """A modelcar of the three layers, resolved by the worker's code as the API would, and its ticket."""

    def __init__(self, registry):
        ns = f"layers-{uuid.uuid4().hex[:8]}"
        writer = registry.add_user(f"{ns}-ci", secrets.token_hex(8), pull=f"{ns}/", push=f"{ns}/")
        self.user = registry.add_user(f"{ns}-pull", secrets.token_hex(8), pull=f"{ns}/")
        layers = [(tar_layer(FIRST), "gzip"), (tar_layer(SECOND), "zstd"), tar_layer(THIRD)]
        self.reference = push_image(registry, f"{ns}/model", writer, "v1", layers)
        resolved, self.endpoint, self.repository, self.extents = oci.resolve(
            self.reference, credentials=oci.Credentials(*self.user), insecure_registries=[registry.host]
        )
        self.files, self.commit = resolved.files, resolved.commit

    def ticket(self, endpoint: str | None = None, **changes) -> FetchTicket:
        token = base64.b64encode(f"{self.user[0]}:{self.user[1]}".encode()).decode()
        return FetchTicket(
            manifest_digest(self.files), "oci", endpoint or self.endpoint, self.repository, self.commit,
            self.files, token=token, extents=changes.pop("extents", self.extents), **changes,
        )  # fmt: skip


@pytest.fixture(scope="module")
def image(registry):
    return Image(registry)


class Cutter:
    """A TCP relay in front of the registry that, once, cuts (or, with ``flip``, corrupts one byte of) the first
    answer stream passing ``at`` bytes: what a dropped connection or a bad middlebox does mid-layer."""

    def __init__(self, target: tuple[str, int], at: int, flip: bool = False):
        self.target, self.at, self.flip = target, at, flip
        self.done = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        seen = 0
        try:
            while data := source.recv(65536):
                if answers and not self.done.is_set() and seen + len(data) > self.at:
                    self.done.set()
                    if not self.flip:
                        sink.sendall(data[: self.at - seen])
                        break
                    data = bytearray(data)
                    data[self.at - seen] ^= 0xFF
                seen += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def registry_address(image: Image) -> tuple[str, int]:
    host, _, port = image.endpoint.removeprefix("http://").partition(":")
    return host, int(port)


def test_resolution_records_each_files_place_in_its_decompressed_layer(image):
    encodings = {path: extent.get("encoding", "") for path, extent in image.extents.items()}
    assert encodings == {
        "config.json": "gzip", "w1.bin": "gzip", "same.bin": "gzip", "w2.bin": "zstd", "tokenizer.json": "",
    }  # fmt: skip
    assert image.extents["same.bin"] == image.extents["w1.bin"]  # a hard link is the file it links to
    assert {f.path: f.hexdigest for f in image.files} == {p: hashlib.sha256(b).hexdigest() for p, b in EXPECTED.items()}


def test_each_compressed_layer_is_read_once_and_every_file_comes_out_byte_identical(image, tmp_path):
    download = Download(image.ticket(), Cache(tmp_path / "c"), Limits(4), settings())
    tree = download.run()
    assert tree_files(tree) == EXPECTED
    # Each compressed layer's bytes read once at most (up to its last wanted file), the uncompressed file's once.
    layers = {(e["blob"], e["size"]) for e in image.extents.values() if e.get("encoding")}
    assert len(layers) == 2
    assert download.stats["network_bytes"] <= sum(size for _, size in layers) + len(THIRD["models/tokenizer.json"])
    assert download.stats["network_bytes"] > len(W1) + len(W2)  # random bytes do not compress
    assert download.downloaded_bytes == download.size


def test_a_connection_dropped_mid_layer_goes_on_from_the_compressed_byte_it_reached(image, tmp_path):
    cutter = Cutter(registry_address(image), at=1 * MiB)
    try:
        download = Download(image.ticket(cutter.url), Cache(tmp_path / "c"), Limits(4), settings())
        tree = download.run()
    finally:
        cutter.close()
    assert cutter.done.is_set()
    assert tree_files(tree) == EXPECTED
    assert download.stats["retries"] >= 1
    layers = {(e["blob"], e["size"]) for e in image.extents.values() if e.get("encoding")}
    # Nothing read twice: the retry asked for the rest of the blob from where the cut left it.
    assert download.stats["network_bytes"] <= sum(size for _, size in layers) + len(THIRD["models/tokenizer.json"])


def test_a_corrupted_byte_in_a_layer_publishes_nothing(image, tmp_path):
    cutter = Cutter(registry_address(image), at=1 * MiB + 100, flip=True)
    cache = Cache(tmp_path / "c")
    try:
        with pytest.raises(DownloadFailed) as failed:
            Download(image.ticket(cutter.url), cache, Limits(4), settings()).run()
    finally:
        cutter.close()
    assert cutter.done.is_set()
    assert failed.value.reason == "IntegrityMismatch", failed.value
    assert not cache.published(manifest_digest(image.files))


def test_a_new_attempt_keeps_what_the_last_one_finished(image, tmp_path):
    cache, digest = Cache(tmp_path / "c"), manifest_digest(image.files)
    first = Download(image.ticket(), cache, Limits(4, bytes_per_second=1 * MiB), settings(checkpoint_interval=0.1))
    thread = threading.Thread(target=lambda: pytest.raises(DownloadFailed, first.run), daemon=True)
    thread.start()
    wait_for(lambda: first.downloaded_bytes >= 3 * MiB, timeout=30)  # about half of it, at 1 MiB/s
    first.cancel()
    thread.join(timeout=30)
    assert not cache.published(digest)
    kept = sum(f.size if (f.complete or f.verified) else f.written_bytes() for f in first._files)
    assert kept >= 3 * MiB

    second = Download(image.ticket(), cache, Limits(4), settings())
    tree = second.run()
    assert tree_files(tree) == EXPECTED
    assert second.stats["resumed_bytes"] == kept  # what the first attempt wrote was not written again
    assert second.downloaded_bytes == second.size


class HubOnlyFanOut:
    """A download's fan-out that fetches each file it is given whole from the ticket's hubs (what ``FanOut`` does
    when no peer holds a segment), so the test sees which files the download handed to its peers' side."""

    def __init__(self, ticket, download, on_peer_bytes):
        self.download, self.given, self._lock = download, [], threading.Lock()

    def open(self, files):
        self.given = [f for f in files if not f.verified]
        self._left = list(self.given)
        return len(self._left)

    def work(self, view):
        while True:
            with self._lock:
                if not self._left:
                    return
                f = self._left.pop()
            self.download._fetcher.fetch(f, 0, f.size, view)

    def unfinished(self):
        return False

    def recover(self, failure):
        return False

    def abort(self):
        pass

    def close(self):
        pass

    def peer_bytes(self):
        return {}

    def banned(self):
        return []


def ready_peer() -> PeerSource:
    return PeerSource("node-b", "https://127.0.0.1:9/", "Ready")


def test_with_a_ready_peer_a_compressed_layers_files_go_to_the_peers_and_the_registry_will_not_serve_a_part(
    image, tmp_path
):
    built = []
    download = Download(
        image.ticket(peers=(ready_peer(),)), Cache(tmp_path / "c"), Limits(4), settings(),
        fan_out=lambda *args: built.append(HubOnlyFanOut(*args)) or built[-1],
    )  # fmt: skip
    with pytest.raises(DownloadFailed) as failed:
        download.run()
    assert sorted(f.file.path for f in built[0].given) == sorted(EXPECTED)  # every file: the peers hold them all
    assert failed.value.reason == "SourceUnavailable"
    assert (
        "inside a compressed layer" in failed.value.message
        and "the next attempt reads the layer" in failed.value.message
    )


def test_an_attempt_after_a_failure_reads_the_layers_whatever_its_peers(image, tmp_path):
    built = []
    download = Download(
        image.ticket(peers=(ready_peer(),)), Cache(tmp_path / "c"), Limits(4), settings(),
        fan_out=lambda *args: built.append(HubOnlyFanOut(*args)) or built[-1], layers_first=True,
    )  # fmt: skip
    assert tree_files(download.run()) == EXPECTED
    assert [f.file.path for f in built[0].given] == ["tokenizer.json"]  # the uncompressed layer's file only


def test_the_engine_retries_a_digest_whose_peers_failed_a_compressed_layers_part_from_the_layers(image, make_engine):
    engine = make_engine(fan_out=HubOnlyFanOut)
    ticket = image.ticket(peers=(ready_peer(),))
    engine.ensure(ticket)
    failed = engine.wait(ticket.digest, timeout=30)
    assert (failed.state, failed.reason) == (FAILED, "SourceUnavailable")
    engine.ensure(ticket, force=True)  # as the plugin does at the retry time
    assert engine.wait(ticket.digest, timeout=30).state == READY
    assert tree_files(engine.cache.tree(ticket.digest)) == EXPECTED


def test_a_download_without_peers_reads_the_layers_beside_its_fan_out(image, tmp_path):
    built = []
    download = Download(
        image.ticket(), Cache(tmp_path / "c"), Limits(4), settings(),
        fan_out=lambda *args: built.append(HubOnlyFanOut(*args)) or built[-1],
    )  # fmt: skip
    assert tree_files(download.run()) == EXPECTED
    assert [f.file.path for f in built[0].given] == ["tokenizer.json"]


@pytest.mark.parametrize("encoding", ["brotli", 7])
def test_a_ticket_naming_an_unknown_encoding_is_refused_before_any_request(image, tmp_path, encoding):
    extents = {p: dict(e, encoding=encoding) for p, e in image.extents.items()}
    with pytest.raises(DownloadFailed) as failed:
        Download(image.ticket(extents=extents), Cache(tmp_path / "c"), Limits(4), settings()).run()
    assert failed.value.reason == "InvalidRequest" and "encoding" in failed.value.message
