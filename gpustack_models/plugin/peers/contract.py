"""Peer fan-out: the contract between a plugin that serves what its node holds and one that downloads it.

No Django here (the downloader may import it); the server is ``peer_server``, the ticket's list of peers
``ticket.PeerSource``.

Where
    Every plugin serves its peer endpoints on its own HTTPS port ``GPUSTACK_PLUGIN_PEER_PORT`` (default
    8444; 0: no peer server, and the API lists no peers), with the same certificate and key as its main
    HTTPS port. Peers are called at ``https://<plugin Pod IP>:<peer port>``, the ``url`` of a ticket's
    peer. The caller checks the peer's certificate against ``GPUSTACK_PLUGIN_PEER_CA_FILE`` (default:
    ``GPUSTACK_PLUGIN_CA_FILE``, the CA the plugins' certificates are issued by; they name the Pod IP).

Who
    Every request carries ``Authorization: Bearer <token>``: the calling plugin's Pod-bound
    ServiceAccount token for the audience ``GPUSTACK_PLUGIN_PEER_AUDIENCE`` (default
    ``gpustack-models-peer``), never its kube-apiserver token or the service's audience (a compromised peer
    must not be able to replay it anywhere else). ``FileToken(path)()`` reads it from the file
    ``GPUSTACK_PLUGIN_PEER_TOKEN_FILE`` (a projected token the kubelet rotates; re-read when it changes);
    the agent holds it as ``Plugin.peer_token`` (and the CA file as ``PluginSettings.peer_ca_file``).
    The serving plugin admits the request when a TokenReview for that audience names the plugin's
    ServiceAccount with a node (the ``authentication.kubernetes.io/node-name`` extra) whose NodeModelStore
    lists the digest in ``spec.models``; the TokenReview and the store are reused for
    ``GPUSTACK_AUTH_CACHE_TTL`` seconds (10), except that a digest missing from a cached ``spec.models``
    has the store read again after a second (it may have just joined). Refusals are Kubernetes ``Status``
    bodies: 401 without a token or with one kube-apiserver does not accept for the peer audience, 403 for
    anyone else's token (a tenant's) and for a plugin whose node does not want the digest (503 with
    ``Retry-After`` while kube-apiserver cannot be asked). Authorization comes before everything else: a
    refused caller learns nothing of what the node holds.

What (``GET`` only; ``<hex>`` is the 64 lowercase hex characters of ``sha256:<hex>``)
    ``/peer/v1/trees/<hex>`` -> 200 ``{"digest": "sha256:<hex>", "state": "Ready"|"Downloading",
    "files": [{"path", "size", "have": [[start, end], ...]}]}``, files in manifest order. ``have`` lists
    the half-open byte ranges on disk: ``[[0, size]]`` for every file of a Ready tree (``[]`` for an empty
    file), the ranges written so far for a download in progress. 404 if the node has neither.

    ``/peer/v1/trees/<hex>/files/<path>`` (``path`` percent-encoded as in a URL, ``/`` kept) with
    ``Range: bytes=a-b`` (inclusive, as HTTP has it; also ``a-`` and ``-n``) -> 206 with exactly those bytes
    and ``Content-Range`` when the node has the whole range, 416 (``Content-Range: bytes */size``) when it
    does not; without ``Range`` -> 200 with the whole file if it has all of it, else 416. A malformed or
    multi-part ``Range``, a path with ``..``, ``.``, an empty segment, a leading ``/`` or a NUL -> 400; a path
    not in the manifest -> 404. Bytes from a download in progress are not verified yet: the caller checks
    every file against the manifest's hash, as it does a hub's bytes, so no peer can make a node publish
    bytes that do not match the manifest.

How much
    The node's store's ``spec.upload``: ``connections`` file transfers in flight at once on the node (one
    more is answered 503 with ``Retry-After: 1``) and ``bytesPerSecond`` bytes per second across them (0: no
    limit), so serving peers never starves the node's own workloads. The service writes it from
    ``GPUSTACK_UPLOAD_CONNECTIONS`` (8) and ``GPUSTACK_UPLOAD_BYTES_PER_SECOND`` (0), overridden per node by
    the Node's annotations ``worker.gpustack.ai/upload-connections`` and
    ``worker.gpustack.ai/upload-bytes-per-second``; the plugin applies each new spec while it serves
    (``peer_server.upload_limits``), its own ``GPUSTACK_PLUGIN_PEER_MAX_CONNECTIONS`` (8) and
    ``GPUSTACK_PLUGIN_PEER_MAX_BYTES_PER_SECOND`` (0) standing for a field the spec leaves out. Bytes
    served are counted in ``/metrics`` by requesting node (``gpustack_models_plugin_peer_served_bytes_total``);
    a downloader counts what it receives from a peer with ``Metrics.bytes_from_peer(node, n)``.

The ticket
    The API's fetch ticket lists ``"peers": [{"node", "url", "state"}]``: the nodes whose store entry of
    the digest is Ready, then (``GPUSTACK_PEER_DOWNLOADING_ALLOWED``, default true) those Downloading it,
    never the asking node, only nodes with a Ready plugin Pod, shuffled within each state, at most
    ``GPUSTACK_TICKET_PEERS_MAX`` (16). ``FetchTicket.peers`` holds them as ``PeerSource``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from urllib.parse import quote

from gpustack_models.plugin.engine.ticket import digest_hex

PREFIX = "/peer/v1/trees/"


def tree_url(base: str, digest: str) -> str:
    """The manifest endpoint of ``digest`` on the peer at ``base`` (a ``PeerSource.url``)."""
    return f"{base.rstrip('/')}{PREFIX}{digest_hex(digest)}"


def file_url(base: str, digest: str, path: str) -> str:
    """The endpoint of one manifest file of ``digest`` on the peer at ``base``."""
    return f"{tree_url(base, digest)}/files/{quote(path, safe='/')}"


def covers(have: Iterable[Iterable[int]], start: int, end: int) -> bool:
    """True if the half-open ranges ``have`` (disjoint, as a peer lists them) hold all of ``[start, end)``."""
    if start >= end:
        return True
    return any(a <= start and end <= b for a, b in have)


class PeerTokenUnavailable(Exception):
    """The plugin has no token for its peers (the file is missing, unreadable or empty)."""


class FileToken:
    """``FileToken(path)()``: the token in ``path``, read again whenever the file changes (a projected
    ServiceAccount token is rotated by the kubelet); ``PeerTokenUnavailable`` if there is none."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._token = ""

    def __call__(self) -> str:
        try:
            info = os.stat(self.path)
        except OSError as exc:
            raise PeerTokenUnavailable(f"no peer token at {self.path}: {exc.strerror}") from None
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            if key != self._seen:
                try:
                    with open(self.path, encoding="ascii") as f:
                        self._token = f.read().strip()
                except (OSError, ValueError) as exc:
                    raise PeerTokenUnavailable(f"the peer token at {self.path} cannot be read: {exc}") from None
                self._seen = key
            if not self._token:
                raise PeerTokenUnavailable(f"the peer token file {self.path} is empty")
            return self._token

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self()}"}
