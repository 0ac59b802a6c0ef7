"""The API's TLS: its serving certificate reloaded from its files and the client CAs from the watched
extension-apiserver-authentication ConfigMap, for new handshakes, with no restart."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from gunicorn.workers import gasgi

from gpustack_models.api.authentication import RequestHeaderSource
from gpustack_models.api.server import TLSASGIWorker
from gpustack_models.api.server_tls import WORKER_BOOT_ERROR, api_tls, worker_ssl_context
from gpustack_models.local import pki
from tests.support.secret_volume import Listener, answer, pair, serial, served_serial, write_volume


def configmap(front_proxy_ca: pki.KeyPair, version: str) -> dict:
    return {
        "metadata": {"resourceVersion": version},
        "data": {"requestheader-client-ca-file": front_proxy_ca.cert_pem.decode(), "client-ca-file": ""},
    }


@pytest.fixture
def served(tmp_path):
    """The API's context on a listener, its certificate in a Secret volume, the ConfigMap as a watch saw it."""
    authority = pki.new_ca("api-ca")
    authority.write(tmp_path, "ca")
    first = pair(authority)
    write_volume(tmp_path / "secret", first)
    source = RequestHeaderSource(client=SimpleNamespace())  # no cluster: the watch's events are given below
    source.event("ADDED", configmap(pki.new_ca("front-proxy-ca-1"), "1"))
    tls = api_tls(str(tmp_path / "secret" / "tls.crt"), str(tmp_path / "secret" / "tls.key"), source)
    listener = Listener(tls)
    yield SimpleNamespace(tmp=tmp_path, authority=authority, first=first, source=source, port=listener.port, tls=tls)
    listener.close()


def test_a_renewed_serving_certificate_is_served_to_new_handshakes(served):
    assert served_serial("127.0.0.1", served.port, served.tmp / "ca.crt") == serial(served.first)
    renewed = pair(served.authority)
    write_volume(served.tmp / "secret", renewed)
    assert served_serial("127.0.0.1", served.port, served.tmp / "ca.crt") == serial(renewed)


def test_a_rotated_front_proxy_ca_is_trusted_at_the_handshake_once_the_configmap_changes(served):
    rotated = pki.new_ca("front-proxy-ca-2")
    client = pki.issue(rotated, "front-proxy-client", client=True).write(served.tmp, "front-proxy")
    assert answer(served.port, served.tmp / "ca.crt", client) is None  # not trusted yet: the handshake fails
    served.source.event("MODIFIED", configmap(rotated, "2"))  # kube-apiserver rotated its front-proxy CA
    assert answer(served.port, served.tmp / "ca.crt", client) == b"front-proxy-client"
    assert served.tls.reloads == 1


def test_a_worker_that_cannot_build_its_context_exits_instead_of_serving_plain_http(tmp_path):
    # gunicorn's worker serves plain HTTP on the port when building its context raises an Exception.
    with pytest.raises(SystemExit) as exited:
        worker_ssl_context(str(tmp_path / "none.crt"), str(tmp_path / "none.key"))
    assert exited.value.code == WORKER_BOOT_ERROR
    # The method of gunicorn's ASGI worker the API's replaces: an upgrade renaming it fails here.
    assert (
        callable(getattr(gasgi.ASGIWorker, "_get_ssl_context", None)) and "_get_ssl_context" in TLSASGIWorker.__dict__
    )
