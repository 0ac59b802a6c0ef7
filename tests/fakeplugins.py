"""Fake node plugins for tests and benchmarks of ``progress``: one asyncio HTTPS server listening on many
loopback addresses, answering ``GET /model/downloads`` as a plugin would (after a configurable delay: to the
service's client certificate alone, asked for at the handshake against the plugin CA), or never answering.
Certificates come from the plugin CA the worker trusts. Each fake notes the bearer tokens callers showed and
the client certificates they presented."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from dataclasses import dataclass, field

from gpustack_models.local import pki

SERVICE_SUBJECT = "system:gpustack-models-service"  # whose client certificate reads live bytes


@dataclass
class FakePlugin:
    downloads: list[dict] = field(default_factory=list)
    hang: bool = False
    requests: int = 0
    tokens: list[str] = field(default_factory=list)  # the bearer tokens callers showed
    clients: list[bytes] = field(default_factory=list)  # the client certificates (DER) of each connection


class FakePlugins:
    def __init__(self, launcher, addresses: list[str], port: int, delay: float = 0.005):
        self.addresses, self.port, self.delay = addresses, port, delay
        self.plugins = {a: FakePlugin() for a in addresses}
        directory = launcher.data_dir / "plugin-pki"
        self.ca_file = directory / "ca.crt"
        if not (directory / "ca.crt").exists():
            pki.new_ca("gpustack-models-plugin-ca").write(directory, "ca")
        authority = pki.KeyPair.load(directory, "ca")
        self.cert, self.key = pki.issue(authority, "fake-plugins", ip_addresses=tuple(addresses), server=True).write(
            directory, f"fake-plugins-{port}"
        )
        self.loop = asyncio.new_event_loop()
        self.servers = []
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        self.ready.wait(30)
        return self

    def __exit__(self, *exc):
        async def shutdown():
            for server in self.servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        context.load_verify_locations(cafile=str(self.ca_file))
        context.verify_mode = ssl.CERT_OPTIONAL  # as a plugin's main port: asked for, checked, not required

        async def start():
            for address in self.addresses:
                server = await asyncio.start_server(
                    lambda r, w, a=address: self._serve(a, r, w), address, self.port, ssl=context, backlog=256
                )
                self.servers.append(server)
            self.ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    async def _serve(self, address, reader, writer):
        plugin = self.plugins[address]
        tls = writer.get_extra_info("ssl_object")
        verified = tls.getpeercert() if tls is not None else None
        if verified:
            plugin.clients.append(tls.getpeercert(binary_form=True))
        names = [v for rdn in (verified or {}).get("subject", ()) for k, v in rdn if k == "commonName"]
        service = names == [SERVICE_SUBJECT]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    break
                plugin.requests += 1
                for line in head.split(b"\r\n"):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.lower() == "authorization" and value.strip().lower().startswith("bearer "):
                        plugin.tokens.append(value.strip()[7:])
                if plugin.hang:
                    await asyncio.sleep(3600)
                await asyncio.sleep(self.delay)
                path = head.split(b" ", 2)[1].decode()
                if path.startswith("/model/downloads") and not service:
                    body, code = b'{"kind": "Status", "code": 401}', b"401 Unauthorized"
                elif path.startswith("/model/downloads"):
                    body, code = json.dumps({"downloads": plugin.downloads}).encode(), b"200 OK"
                else:
                    body, code = b"{}", b"404 Not Found"
                writer.write(
                    b"HTTP/1.1 "
                    + code
                    + b"\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError, ssl.SSLError):
            pass
        finally:
            writer.close()
