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
    The caller presents its client certificate at the TLS handshake: issued by the API with its serving
    certificate (``POST /internal/v1/plugin-certificates``), of the plugin CA, subject
    ``system:gpustack-models-plugin:<node>``, ExtendedKeyUsage ``clientAuth`` only, renewed with the serving
    one (``client.crt``/``client.key`` beside ``serving.crt``/``serving.key``). ``ClientCertificate`` holds
    it for the downloader as a TLS context, loaded again when the files change; no bearer token is ever
    sent to a peer (a token a node received could be replayed to every other node). The serving plugin
    requires a client certificate chained to ``GPUSTACK_PLUGIN_PEER_CA_FILE`` at the handshake (none, one
    of another CA, or one that may not authenticate a client: no connection), checks again in Python that
    it has ``clientAuth`` and a subject of that prefix (401 without, 403 for another name, the service's
    included), and admits the request when that node's NodeModelStore lists the digest in ``spec.models``;
    the store is reused for ``GPUSTACK_AUTH_CACHE_TTL`` seconds (10), except that a digest missing from a
    cached ``spec.models`` has the store read again after a second (it may have just joined). Refusals are
    Kubernetes ``Status`` bodies: 403 for a plugin whose node does not want the digest (503 with
    ``Retry-After`` while kube-apiserver cannot be asked). Authorization comes before everything else: a
    refused caller learns nothing of what the node holds. A node's own certificate names that node only:
    it reads what that node wants, nothing more.

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
import ssl
import threading
from collections.abc import Iterable
from urllib.parse import quote

from gpustack_models.file_stamps import file_stamps
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


class ClientCertificateUnavailable(Exception):
    """The plugin has no client certificate for its peers (the files are missing or do not load)."""


class ClientCertificate:
    """``ClientCertificate(cert_file, key_file, ca_file)()``: a TLS client context presenting the certificate
    and key of these files and checking peers against ``ca_file``, made again whenever one of the three files
    changes (a renewed certificate, a rotated CA); ``ClientCertificateUnavailable`` while there is none. A
    pair caught between its two writes keeps the previous context."""

    def __init__(self, cert_file: str | os.PathLike, key_file: str | os.PathLike, ca_file: str | None):
        self.cert_file, self.key_file, self.ca_file = os.fspath(cert_file), os.fspath(key_file), ca_file
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._context: ssl.SSLContext | None = None

    def _stamp(self) -> tuple:
        stamps = file_stamps(self.cert_file, self.key_file)
        for path, stamp in zip((self.cert_file, self.key_file), stamps):
            if stamp is None:
                raise ClientCertificateUnavailable(f"no client certificate at {path}: missing or unreadable")
        return stamps + (file_stamps(self.ca_file) if self.ca_file else ())  # a rotated peer CA counts too

    def __call__(self) -> ssl.SSLContext:
        stamp = self._stamp()
        with self._lock:
            if stamp != self._seen:
                try:
                    context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else _public()
                    context.load_cert_chain(self.cert_file, self.key_file)
                except (OSError, ValueError, ssl.SSLError) as exc:
                    if self._context is None:
                        raise ClientCertificateUnavailable(f"the client certificate does not load: {exc}") from None
                    return self._context  # between the key's and the certificate's writes: the previous pair
                self._context, self._seen = context, stamp
            return self._context


def _public() -> ssl.SSLContext:
    return ssl.create_default_context()
