"""What a download asks of the fan-out to the ticket's peers: the plugin's fan-out offers every call of the
protocol, and a download builds its own with the factory it is given, counts what the peers sent apart from
the hubs' bytes, and stops it with the download."""

from __future__ import annotations

import hashlib
import inspect

from gpustack_models.plugin.engine import Download, FetchTicket
from gpustack_models.plugin.engine.cache import Cache
from gpustack_models.plugin.engine.peering import FanOutLike
from gpustack_models.plugin.peers.fanout import FanOut
from gpustack_models.sources.manifest import ManifestFile, manifest_digest

FILES = (ManifestFile("model.bin", 3, "sha256", hashlib.sha256(b"abc").hexdigest(), True),)
TICKET = FetchTicket(manifest_digest(FILES), "huggingFace", "http://127.0.0.1:9", "org/model", "c0ffee", FILES)


def protocol_calls() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(FanOutLike).items()
        if callable(member) and not name.startswith("_")
    }


def test_the_plugins_fan_out_offers_every_call_a_download_makes():
    calls = protocol_calls()
    assert set(calls) == {"open", "work", "unfinished", "recover", "abort", "close", "peer_bytes", "banned"}
    for name, expected in calls.items():
        offered = inspect.signature(getattr(FanOut, name))
        kinds = [p.kind for p in offered.parameters.values() if p.default is inspect.Parameter.empty]
        assert kinds == [p.kind for p in expected.parameters.values()], name  # called with the same arguments


class Recorded:
    """The peers' side of one download, as a download sees it: what it was asked, what it reports."""

    def __init__(self, ticket, download, on_peer_bytes):
        self.built_with = (ticket, download, on_peer_bytes)
        self.calls: list[str] = []

    def open(self, files):
        self.calls.append("open")
        return 0

    def work(self, view):
        self.calls.append("work")

    def unfinished(self):
        return False

    def recover(self, failure):
        return False

    def abort(self):
        self.calls.append("abort")

    def close(self):
        self.calls.append("close")

    def peer_bytes(self):
        return {"node-b": 40, "node-c": 2}

    def banned(self):
        return []


def test_a_download_builds_its_fan_out_and_counts_the_peers_bytes_apart(tmp_path):
    built: list[Recorded] = []

    def factory(ticket, download, on_peer_bytes):
        built.append(Recorded(ticket, download, on_peer_bytes))
        return built[-1]

    def heard(node, n):
        pass

    download = Download(TICKET, Cache(tmp_path), fan_out=factory, on_peer_bytes=heard)

    assert len(built) == 1 and built[0].built_with == (TICKET, download, heard)
    download.stats["network_bytes"] = 100  # peers' bytes are network bytes too
    assert download.source_bytes == {"hub": 58, "node-b": 40, "node-c": 2}
    download.cancel()
    assert built[0].calls == ["abort"]


def test_a_download_without_a_fan_out_counts_hub_bytes_only(tmp_path):
    download = Download(TICKET, Cache(tmp_path))
    download.stats["network_bytes"] = 100
    assert download.source_bytes == {"hub": 100}
