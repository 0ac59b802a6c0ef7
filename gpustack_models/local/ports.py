"""Loopback ports for the local processes, the control plane's ports, and this host's address.

``free_port`` hands out a loopback port nothing listens on: any the kernel offers, or, with
``GPUSTACK_LOCAL_PORTS=FIRST-LAST``, only one of that range (local stacks side by side on one host never
pick the same port). ``Ports`` are the control plane's five; ``primary_address`` is what kube-apiserver
advertises.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

_handed: set[int] = set()  # ports this process handed out (one may not be bound yet)


def local_port_range() -> tuple[int, int] | None:
    """``GPUSTACK_LOCAL_PORTS=FIRST-LAST``: the only ports ``free_port`` hands out (unset: any the kernel
    offers), so local stacks side by side on one host (the test suite's lanes) never pick the same port."""
    value = os.environ.get("GPUSTACK_LOCAL_PORTS", "").strip()
    if not value:
        return None
    try:
        first, last = (int(part) for part in value.split("-"))
    except ValueError:
        raise RuntimeError(f"GPUSTACK_LOCAL_PORTS={value!r}: expected FIRST-LAST, e.g. 20000-21999") from None
    if not 1024 <= first < last <= 65535:
        raise RuntimeError(f"GPUSTACK_LOCAL_PORTS={value!r}: expected 1024 <= FIRST < LAST <= 65535")
    return first, last


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on: any (the kernel's choice), or one of ``GPUSTACK_LOCAL_PORTS``."""
    span = local_port_range()
    if span is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    first, last = span
    for _ in range(2):  # the second time round, ports handed out long ago may be free again
        start = secrets.randbelow(last - first + 1)
        for offset in range(last - first + 1):
            port = first + (start + offset) % (last - first + 1)
            if port not in _handed and _bindable(port):
                _handed.add(port)
                return port
        _handed.clear()
    raise RuntimeError(f"no free port left in GPUSTACK_LOCAL_PORTS={first}-{last}")


def primary_address() -> str:
    """A non-loopback IPv4 address of this host for --advertise-address (kube-apiserver refuses loopback)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent; this only picks the outgoing interface
            address = s.getsockname()[0]
        if not address.startswith("127."):
            return address
    except OSError:
        pass
    # With --endpoint-reconciler-type=none the address is only advertised, never dialled.
    return "192.0.2.10"


@dataclass
class Ports:
    apiserver: int
    etcd_client: int
    etcd_peer: int
    controller_manager: int
    scheduler: int = 10259  # a default: cluster.json written before the scheduler has no such port

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port())

    @classmethod
    def defaults(cls) -> Ports:
        return cls(apiserver=6443, etcd_client=12379, etcd_peer=12380, controller_manager=10257, scheduler=10259)

    @classmethod
    def parse(cls, value: str) -> Ports:
        """``GPUSTACK_LOCAL_CLUSTER_PORTS``: five ports in the order of the fields, or ``free``."""
        if value.strip() == "free":
            return cls.free()
        return cls(*(int(port) for port in value.split(",")))
