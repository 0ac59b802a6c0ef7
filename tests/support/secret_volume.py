"""Certificate files replaced the way the kubelet updates a Secret or ConfigMap volume, and the certificate a
TLS server hands a new handshake.

The kubelet (``AtomicWriter``) writes a volume's files into a new hidden directory ``..<timestamp>``, points a
new symlink ``..data_tmp`` at it, renames that over ``..data`` (one atomic step), and each visible name is a
symlink ``name -> ..data/name`` made once; the old directory is then removed.

Also small TLS peers for the rotation tests: ``Listener`` (asyncio's server with one listener context),
``Connection`` (a keep-alive client: a line out, the peer's CN back) and ``answer``.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import os
import shutil
import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509

from gpustack_models.local import pki

_versions = itertools.count()


def write_volume(directory: Path, files: dict[str, bytes]) -> None:
    """Replace the volume at ``directory`` with ``files`` (name -> content) as the kubelet does."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y_%m_%d_%H_%M_%S")
    version = directory / f"..{stamp}.{os.getpid()}{next(_versions)}"
    version.mkdir(mode=0o755)
    for name, content in files.items():
        (version / name).write_bytes(content)
    data, tmp = directory / "..data", directory / "..data_tmp"
    old = os.readlink(data) if data.is_symlink() else None
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(version.name)
    os.rename(tmp, data)
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    if old:
        shutil.rmtree(directory / old, ignore_errors=True)


def served_serial(host: str, port: int, ca_file, client: tuple | None = None, timeout: float = 5.0) -> int:
    """The serial number of the certificate the server at ``host:port`` presents to a new handshake,
    verified against ``ca_file`` (presenting ``client``, a (cert, key) pair, when given)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.check_hostname = False
    if client:
        context.load_cert_chain(*(str(path) for path in client))
    with (
        socket.create_connection((host, port), timeout=timeout) as sock,
        context.wrap_socket(sock) as tls,
    ):
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def pair(ca, name="server") -> dict[str, bytes]:
    issued = pki.issue(ca, name, ip_addresses=("127.0.0.1",), server=True)
    return {"tls.crt": issued.cert_pem, "tls.key": issued.key_pem}


def serial(files) -> int:
    return x509.load_pem_x509_certificate(files["tls.crt"]).serial_number


class Connection:
    """A keep-alive TLS connection: one line out, one line back."""

    def __init__(self, port, ca_file, client=None):
        context = ssl.create_default_context(cafile=str(ca_file))
        context.check_hostname = False
        if client:
            context.load_cert_chain(*(str(path) for path in client))
        self.tls = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5))
        self.file = self.tls.makefile("rb")

    def ask(self) -> bytes:
        self.tls.sendall(b"who\n")
        return self.file.readline().strip()

    def close(self):
        self.file.close()
        self.tls.close()


def answer(port, ca_file, client) -> bytes | None:
    """The server's answer on a new connection presenting ``client``; ``None`` when it refused the handshake
    (with TLS 1.3 the client learns it at its first read: an alert, or the connection closed)."""
    try:
        connection = Connection(port, ca_file, client)
        try:
            return connection.ask() or None
        finally:
            connection.close()
    except (ssl.SSLError, ConnectionError):
        return None


class Listener:
    """asyncio's server, one context for its listener: ``tls.listening_context()``."""

    def __init__(self, tls):  # a serving_tls.ServingTLS
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def handle(reader, writer):
            try:
                while await reader.readline():
                    writer.write(common_name(writer.get_extra_info("peercert")) + b"\n")
                    await writer.drain()
            except ConnectionError:  # a client that only took the handshake
                pass
            writer.close()

        async def start():
            return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls.listening_context())

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(5)
        self.port = self.server.sockets[0].getsockname()[1]

    def close(self):
        async def stop():
            self.server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)


def common_name(peer) -> bytes:
    names = [value for rdn in (peer or {}).get("subject", ()) for key, value in rdn if key == "commonName"]
    return (names[0] if names else "-").encode()
