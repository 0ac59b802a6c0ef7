"""The client address the console counts failed sign-ins against (django-axes' ``AXES_CLIENT_IP_CALLABLE``).

It is the connection's peer, unless that peer is one of ``GPUSTACK_CONSOLE_TRUSTED_PROXIES``: then the
right-most address of ``X-Forwarded-For`` that is not a trusted proxy (each trusted proxy appends the address it
received the request from, so what stands left of the last one's entry is the client's to write, and ignored).
With no trusted proxy configured the header is ignored, whoever sends it: a client cannot choose the address its
failures are counted against.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _address(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1, for the networks too
    return address


@lru_cache(maxsize=4)
def _networks(proxies: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(proxy, strict=False) for proxy in proxies)


def _trusted(address: Address, networks: tuple[Network, ...]) -> bool:
    return any(address in network for network in networks)


def forwarded_client(peer: str, forwarded_for: str, proxies: tuple[str, ...]) -> str | None:
    """The client of a request from ``peer`` carrying ``forwarded_for`` (``X-Forwarded-For``), with
    ``proxies`` trusted; ``None`` when the peer is not an IP address (nothing to count against)."""
    address, networks = _address(peer), _networks(proxies)
    if address is None:
        return None
    for hop in reversed(forwarded_for.split(",") if forwarded_for else []):
        if not _trusted(address, networks):
            break
        forwarded = _address(hop)
        if forwarded is None:  # unreadable: the last trusted proxy is the nearest address known
            break
        address = forwarded
    return str(address)


def client_ip(request) -> str | None:
    """The address the failed sign-ins of ``request`` count against."""
    return forwarded_client(
        request.META.get("REMOTE_ADDR", ""),
        request.META.get("HTTP_X_FORWARDED_FOR", ""),
        tuple(settings.CONSOLE_TRUSTED_PROXIES),
    )
