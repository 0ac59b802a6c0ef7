"""HTTPS with the ticket's CA bundle, and the ticket's proxy; never the environment's."""

from __future__ import annotations

import base64
import socket
import threading

import pytest

from gpustack_models.local import pki
from gpustack_models.plugin.engine import FAILED, READY, FetchTicket
from tests.fakehub import FakeHub
from tests.plugin.conftest import MiB, manifest, random_bytes, tree_files


class TunnelProxy:
    """A minimal forward proxy on loopback: ``CONNECT`` tunnels, and plain-HTTP requests with an
    absolute URL. Records what it was asked for (and the Proxy-Authorization header)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.seen: list[tuple[str, str, str | None]] = []  # (method, target, proxy authorization)
        self._threads: list[threading.Thread] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self._stop = True
        self.sock.close()

    def _accept(self):
        while not self._stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket):
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(65536)
                if not chunk:
                    return
                head += chunk
            header, rest = head.split(b"\r\n\r\n", 1)
            lines = header.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ")
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            self.seen.append((method, target, headers.get("Proxy-Authorization")))
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                upstream = socket.create_connection((host, int(port)))
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                first = rest
            else:  # GET http://host:port/path: forward with the origin-form target
                from urllib.parse import urlsplit

                parts = urlsplit(target)
                upstream = socket.create_connection((parts.hostname, parts.port or 80))
                path = parts.path + (f"?{parts.query}" if parts.query else "")
                kept = [line for line in lines[1:] if not line.lower().startswith("proxy-")]
                first = ("\r\n".join([f"{method} {path} {version}"] + kept) + "\r\n\r\n").encode("latin-1") + rest
            if first:
                upstream.sendall(first)
            pump = threading.Thread(target=self._pipe, args=(upstream, client), daemon=True)
            pump.start()
            self._pipe(client, upstream)
            pump.join(10)
        except OSError:
            pass
        finally:
            client.close()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket):
        try:
            while data := source.recv(262144):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def tls_hub(hub_env, tmp_path):
    ca = pki.new_ca("plugin test CA")
    ca_crt, _ = ca.write(tmp_path, "ca")
    crt, key = pki.issue(ca, "fakehub", ip_addresses=("127.0.0.1", "127.0.0.2"), server=True).write(tmp_path, "hub")
    with FakeHub(tls=(crt, key)) as hub:
        hub.ca_bundle = str(ca_crt)
        yield hub


@pytest.fixture
def proxy():
    p = TunnelProxy()
    yield p
    p.close()


def _ticket(hub, repo, commit, **kwargs) -> FetchTicket:
    files = manifest(hub, repo, commit)
    from gpustack_models.sources.manifest import manifest_digest

    return FetchTicket(manifest_digest(files), "huggingFace", hub.url, repo, commit, files, **kwargs)


def test_it_downloads_over_https_with_the_tickets_ca_bundle_only(tls_hub, make_engine, hub_env):
    data = random_bytes(2 * MiB, seed=30)
    commit = tls_hub.add_hf_repo("org/tls", {"config.json": b"{}", "model.safetensors": data})
    # The environment trusts the test CA; a ticket without a CA bundle must not pick that up.
    hub_env.setenv("SSL_CERT_FILE", tls_hub.ca_bundle)
    hub_env.setenv("REQUESTS_CA_BUNDLE", tls_hub.ca_bundle)
    engine = make_engine()

    untrusted = _ticket(tls_hub, "org/tls", commit)
    engine.ensure(untrusted)
    entry = engine.wait(untrusted.digest, timeout=30)
    assert entry.state == FAILED and entry.reason == "SourceUnavailable"
    assert "CERTIFICATE_VERIFY_FAILED" in entry.message

    trusted = _ticket(tls_hub, "org/tls", commit, ca_bundle=tls_hub.ca_bundle)
    engine.ensure(trusted, force=True)
    assert engine.wait(trusted.digest, timeout=30).state == READY
    assert (engine.path(trusted.digest) / "model.safetensors").read_bytes() == data


def test_it_tunnels_https_through_the_tickets_proxy(tls_hub, proxy, make_engine, hub_env):
    token = "hf_proxy_token"
    commit = tls_hub.add_hf_repo(
        "org/via", {"config.json": b"{}", "model.safetensors": random_bytes(MiB, seed=31)}, private=True, token=token
    )
    hub_env.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # never used: the ticket says which proxy
    proxy_url = proxy.url.replace("http://", "http://user:p%40ss@")
    ticket = _ticket(tls_hub, "org/via", commit, token=token, proxy=proxy_url, ca_bundle=tls_hub.ca_bundle)
    assert "p%40ss" not in repr(ticket)
    engine = make_engine()

    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).state == READY

    assert tree_files(engine.path(ticket.digest)) == tls_hub.files("org/via", commit)
    hub_port, cdn_port = tls_hub.url.rsplit(":", 1)[1], tls_hub.cdn_url.rsplit(":", 1)[1]
    targets = {target for method, target, _ in proxy.seen if method == "CONNECT"}
    assert targets == {f"127.0.0.1:{hub_port}", f"127.0.0.2:{cdn_port}"}
    expected_auth = "Basic " + base64.b64encode(b"user:p@ss").decode()
    assert {auth for _, _, auth in proxy.seen} == {expected_auth}
    assert {r.token for r in tls_hub.requests if r.listener == "cdn"} == {None}


def test_it_sends_plain_http_through_the_tickets_proxy(fakehub, proxy, make_engine):
    commit = fakehub.add_hf_repo("org/plain", {"config.json": b"{}", "model.safetensors": random_bytes(MiB, seed=32)})
    ticket = _ticket(fakehub, "org/plain", commit, proxy=proxy.url)
    engine = make_engine()

    engine.ensure(ticket)
    assert engine.wait(ticket.digest, timeout=30).state == READY

    assert tree_files(engine.path(ticket.digest)) == fakehub.files("org/plain", commit)
    assert proxy.seen and all(
        method == "GET" and target.startswith("http://127.0.0.") for method, target, _ in proxy.seen
    )
