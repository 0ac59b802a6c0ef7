"""The peers a fetch ticket lists: other nodes' plugins that hold (``Ready``) or are downloading
(``Downloading``) its digest, reached at their peer endpoints. Part of ``ticket``, which re-exports them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpustack_models.plugin.engine.failures import INVALID_REQUEST, DownloadFailed

PEER_STATES = ("Ready", "Downloading")
_NODE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True)
class PeerSource:
    """Another node's plugin that holds the ticket's digest (``state`` ``Ready``) or is downloading it
    (``Downloading``: it serves the ranges it has), at ``url`` (``https://<Pod IP>:<peer port>``). Its
    endpoints are described in ``peers``; every byte from it is verified against the manifest as from a hub."""

    node: str
    url: str
    state: str = "Ready"

    def __post_init__(self):
        if isinstance(self.url, str):
            object.__setattr__(self, "url", self.url.rstrip("/"))

    def check(self) -> None:
        """Raise ``DownloadFailed(InvalidRequest)`` unless the peer is usable: a node name, an
        ``https://host:port`` URL with nothing else in it, a known state."""
        if not isinstance(self.node, str) or not _NODE.fullmatch(self.node):
            raise _invalid("a peer's node is not a node name")
        if self.state not in PEER_STATES:
            raise _invalid(f"a peer's state must be one of {', '.join(PEER_STATES)}")
        try:
            url = urlsplit(self.url) if isinstance(self.url, str) else None
            port = url.port if url is not None else None
        except ValueError:
            url = port = None
        if url is None or url.scheme != "https" or not url.hostname or port is None:
            raise _invalid("a peer's url must be https://<host>:<port>")
        if url.path or url.query or url.fragment or url.username or url.password:
            raise _invalid("a peer's url must carry no path, query, fragment or credentials")

    def to_dict(self) -> dict[str, str]:
        return {"node": self.node, "url": self.url, "state": self.state}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PeerSource:
        return cls(node=data["node"], url=data["url"], state=data.get("state") or "Ready")


def _invalid(message: str) -> DownloadFailed:
    return DownloadFailed(INVALID_REQUEST, f"invalid fetch ticket: {message}")


def usable_peers(items) -> tuple[PeerSource, ...]:
    """The well-formed peers of a ticket's ``peers`` list (or of ``PeerSource`` items), each node once;
    the others are left out (a peer is an optional source: the hub remains)."""
    out: dict[str, PeerSource] = {}
    for item in items if isinstance(items, (list, tuple)) else ():
        try:
            peer = item if isinstance(item, PeerSource) else PeerSource.from_dict(item)
            peer.check()
        except (DownloadFailed, KeyError, TypeError, AttributeError):
            continue
        out.setdefault(peer.node, peer)
    return tuple(out.values())
