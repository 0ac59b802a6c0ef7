"""The peers a fetch ticket carries: read, kept through a round trip, and refused when unusable."""

import pytest

from gpustack_models.plugin.engine import FetchTicket
from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.ticket import PeerSource
from gpustack_models.sources.manifest import ManifestFile, manifest_digest


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
