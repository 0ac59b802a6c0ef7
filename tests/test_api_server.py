"""The HTTPS layer: gunicorn's ASGI worker extended with the client certificate, and raw header lines."""

import asyncio
import ssl

from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.workers import gasgi

from gpustack_models.api.server import TLSASGIProtocol, TLSASGIWorker


def front_proxy_cert(cluster):
    return (str(cluster.pki_path("front-proxy-client.crt")), str(cluster.pki_path("front-proxy-client.key")))


def test_it_extends_the_hooks_the_installed_gunicorn_has():
    # If an upgrade renames these, the front proxy would silently stop authenticating: fail here instead.
    assert hasattr(ASGIProtocol, "_build_http_scope")
    assert gasgi.ASGIProtocol is ASGIProtocol or gasgi.ASGIProtocol is TLSASGIProtocol
    assert issubclass(TLSASGIWorker, gasgi.ASGIWorker)
    assert "init_process" in TLSASGIWorker.__dict__


def test_it_puts_the_peer_certificate_into_the_asgi_scope(cluster):
    """Build a scope the way the worker does for a TLS connection that presented a certificate."""

    der = ssl.PEM_cert_to_DER_cert(cluster.pki_path("front-proxy-client.crt").read_text())

    class FakeSSL:
        def getpeercert(self, binary_form=False):
            return der

    class FakeTransport:
        def get_extra_info(self, name, default=None):
            return FakeSSL() if name == "ssl_object" else default

    class FakeRequest:
        headers_bytes = [(b"x-remote-group", b"a,b"), (b"x-remote-group", b"c")]
        version = (1, 1)
        method = "GET"
        scheme = "https"
        path = "/x"
        raw_path = b"/x"
        query = ""

    class FakeWorker:
        state = {}
        cfg = type("cfg", (), {"root_path": ""})()

    protocol = TLSASGIProtocol.__new__(TLSASGIProtocol)
    protocol.transport = FakeTransport()
    protocol.worker = FakeWorker()
    protocol._scope_addresses = None
    protocol._root_path = ""
    scope = protocol._build_http_scope(FakeRequest(), ("127.0.0.1", 1), ("127.0.0.1", 2))
    chain = scope["extensions"]["tls"]["client_cert_chain"]
    assert ssl.PEM_cert_to_DER_cert(chain[0]) == der
    assert scope["headers"] == [(b"x-remote-group", b"a,b"), (b"x-remote-group", b"c")]


def test_it_trusts_identity_headers_only_behind_the_front_proxy_certificate(worker_api, cluster):
    headers = {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"}
    untrusted = worker_api.session(headers=headers).get(f"{worker_api.url}/apis/worker.gpustack.ai/v1/nodemodelstores")
    assert untrusted.status_code == 401
    assert untrusted.json()["kind"] == "Status" and untrusted.json()["reason"] == "Unauthorized"
    # The cluster's admin certificate is a valid client certificate, but not the front proxy's.
    admin_cert = (str(cluster.pki_path("admin.crt")), str(cluster.pki_path("admin.key")))
    wrong_ca = worker_api.session(cert=admin_cert, headers=headers).get(
        f"{worker_api.url}/apis/worker.gpustack.ai/v1/nodemodelstores"
    )
    assert wrong_ca.status_code == 401
    trusted = worker_api.session(cert=front_proxy_cert(cluster), headers=headers).get(
        f"{worker_api.url}/apis/worker.gpustack.ai/v1/nodemodelstores"
    )
    assert trusted.status_code == 200, trusted.text
    assert trusted.json()["apiVersion"] == "worker.gpustack.ai/v1"


def test_it_answers_health_without_credentials(worker_api):
    for path in ("/healthz", "/livez", "/readyz"):
        assert worker_api.session().get(f"{worker_api.url}{path}").status_code == 200


def test_it_serves_watches_from_one_event_loop(worker_api, cluster):
    """Many open watches and a read still answer: watches do not take a thread each."""
    import aiohttp

    async def run():
        context = ssl.create_default_context(cafile=str(worker_api.ca_file))
        context.load_cert_chain(*front_proxy_cert(cluster))
        headers = {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=0)) as session:
            url = f"{worker_api.url}/apis/worker.gpustack.ai/v1/nodemodelstores?watch=true&timeoutSeconds=30"
            watches = [await session.get(url, headers=headers) for _ in range(120)]
            try:
                assert all(w.status == 200 for w in watches)
                async with session.get(
                    f"{worker_api.url}/apis/worker.gpustack.ai/v1/nodemodelstores",
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as resp:
                    assert resp.status == 200
            finally:
                for w in watches:
                    w.close()

    asyncio.run(run())
