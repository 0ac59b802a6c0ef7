"""What a download asks of fetching from the ticket's peers beside its hubs.

The engine knows no peers: the plugin's glue gives it a ``FanOutFactory`` (``peers.fanout.FanOut`` with
the node's name, its client certificate for its peers and the swarm's tuning), and each ``Download``
builds its fan-out with it. Without one, a download fetches from the ticket's hubs only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gpustack_models.plugin.engine.failures import DownloadFailed
from gpustack_models.plugin.engine.ranges import FileProgress
from gpustack_models.plugin.engine.ticket import FetchTicket


class FanOutLike(Protocol):
    """The peers' side of one download: which segment from which source, and fetching it."""

    def open(self, files: list[FileProgress]) -> int:
        """Plan the segments of ``files``; the number of segments."""

    def work(self, view: memoryview) -> None:
        """One fetching thread: fetch segments into ``view`` until none is left or the download stops."""

    def unfinished(self) -> bool:
        """Segments are left (a file thrown away after the fetching threads had finished)."""

    def recover(self, failure: DownloadFailed) -> bool:
        """True if a file that failed its hash is mended or fetched again (peers had sent bytes of it)."""

    def abort(self) -> None: ...

    def close(self) -> None: ...

    def peer_bytes(self) -> dict[str, int]:
        """Bytes received so far from each peer's node."""

    def banned(self) -> list[str]:
        """The peers banned for sending bad bytes."""


# fan_out(ticket, download, on_peer_bytes): the fan-out of ``download`` (a ``Download``), which calls
# ``on_peer_bytes(node, n)`` for the bytes each peer sends.
FanOutFactory = Callable[[FetchTicket, Any, Callable[[str, int], None] | None], FanOutLike]
