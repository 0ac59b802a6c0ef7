"""User-space TCP relays that stand in for kube-proxy and for routes the real node's Pods lack.

The local control plane has no kube-proxy and listens on loopback only, as do the suite's PostgreSQL, Redis
and fake hub. For the chart to run as Pods on the real node:

- a ClusterIP of a Service (``service_relay``) is added to the host's ``lo`` and a relay listens on it,
  forwarding each connection to one of the Service's ready endpoints, read from its EndpointSlices when the
  connection comes (so it follows Pods as they come, go ready or terminate). kube-apiserver dials the
  ClusterIP of an APIService's Service (no aggregator routing here) and so reaches the API's Pods. The
  ``kubernetes`` Service's ClusterIP, which every Pod is told through ``KUBERNETES_SERVICE_HOST``, is relayed
  to kube-apiserver's loopback port the same way (its certificate names that address);
- relays on the Pod bridge's host address (``bridge_relay``; the Pods' default route goes there) forward to
  a loopback service. They bind before the bridge has its address (``IP_FREEBIND``).

Each address added to ``lo`` is written to the real node's host-wide record first, so a session that dies
leaves nothing the next one does not remove (``tests/support/kubelet.py``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator

from gpustack_models import kube
from tests.support import kubelet

IP_FREEBIND = 15  # linux/in.h
Targets = Callable[[], list[tuple[str, int]]]


class Relay:
    """Listens on ``address`` and pipes each connection to the first of ``targets()`` that accepts it."""

    def __init__(self, address: tuple[str, int], targets: Targets, freebind: bool = False):
        self.targets = targets
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if freebind:
            self.listener.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
        self.listener.bind(address)
        self.listener.listen(128)
        self.address = self.listener.getsockname()
        self.connections: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, name=f"relay {self.address}", daemon=True).start()

    @property
    def port(self) -> int:
        return self.address[1]

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        for target in self.targets():
            try:
                return socket.create_connection(target, timeout=5)
            except OSError:
                continue
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        upstream.settimeout(None)
        with self.lock:
            if self.closed:
                client.close(), upstream.close()
                return
            self.connections |= {client, upstream}
        back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
        back.start()
        _pipe(client, upstream)
        back.join()
        with self.lock:
            self.connections -= {client, upstream}
        client.close()
        upstream.close()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            open_ = list(self.connections)
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self.listener.close()
        for sock in open_:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def ready_endpoints(admin: kube.Kube, namespace: str, service: str) -> list[tuple[str, int]]:
    """The ready (not terminating) endpoints of a Service of one port, from its EndpointSlices."""
    query = {"labelSelector": f"kubernetes.io/service-name={service}"}
    slices = admin.get(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices", query=query)["items"]
    found = []
    for item in slices:
        ports = item.get("ports") or []
        for endpoint in item.get("endpoints") or []:
            if ports and (endpoint.get("conditions") or {}).get("ready"):
                found.append((endpoint["addresses"][0], ports[0]["port"]))
    return found


@contextlib.contextmanager
def loopback_address(address: str) -> Iterator[str]:
    """``address`` on the host's ``lo`` (recorded for a crashed session's successor), removed after."""
    assert ipaddress.ip_address(address) in ipaddress.ip_network("10.96.0.0/16"), address  # the Service range
    kubelet.record_loopback(address)
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], capture_output=True, check=False)
    try:
        yield address
    finally:
        kubelet.forget_loopback(address)


@contextlib.contextmanager
def relaying(address: tuple[str, int], targets: Targets, freebind: bool = False) -> Iterator[Relay]:
    relay = Relay(address, targets, freebind)
    try:
        yield relay
    finally:
        relay.close()


@contextlib.contextmanager
def service_relay(admin: kube.Kube, namespace: str, service: str) -> Iterator[Relay]:
    """A relay on the ClusterIP and port of ``service`` to its ready endpoints."""
    spec = admin.get(f"/api/v1/namespaces/{namespace}/services/{service}")["spec"]
    with (
        loopback_address(spec["clusterIP"]),
        relaying(
            (spec["clusterIP"], spec["ports"][0]["port"]), lambda: ready_endpoints(admin, namespace, service)
        ) as relay,
    ):
        yield relay


def bridge_relay(port: int, host: str = "127.0.0.1") -> contextlib.AbstractContextManager[Relay]:
    """A relay on the Pod bridge's host address (any free port) to ``host:port``."""
    return relaying((kubelet.BRIDGE_ADDRESS, 0), lambda: [(host, port)], freebind=True)
