"""The address the console counts failed sign-ins against: the peer, unless a trusted proxy forwarded the
request; a client's own X-Forwarded-For never chooses it."""

import pytest

from gpustack_models.console.client_ip import forwarded_client

INGRESS = ("10.42.0.0/16",)


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "proxies", "client"),
    [
        # No trusted proxy: the header is ignored, whatever it says.
        ("127.0.0.1", "", (), "127.0.0.1"),
        ("127.0.0.1", "203.0.113.9", (), "127.0.0.1"),
        ("192.0.2.5", "10.42.0.7, 203.0.113.9", (), "192.0.2.5"),
        # A peer that is not a trusted proxy: its header is ignored too.
        ("192.0.2.5", "203.0.113.9", INGRESS, "192.0.2.5"),
        # The Ingress controller forwards: the client is the address it appended.
        ("10.42.3.4", "203.0.113.9", INGRESS, "203.0.113.9"),
        # What the client wrote itself stands left of it, and is ignored.
        ("10.42.3.4", "198.51.100.1, 203.0.113.9", INGRESS, "203.0.113.9"),
        ("10.42.3.4", "10.42.9.9, 203.0.113.9", INGRESS, "203.0.113.9"),
        # Proxies in a row, each trusted: the right-most untrusted address.
        ("10.42.3.4", "203.0.113.9, 10.42.5.5", INGRESS, "203.0.113.9"),
        # Nothing forwarded, or nothing readable: the nearest trusted proxy.
        ("10.42.3.4", "", INGRESS, "10.42.3.4"),
        ("10.42.3.4", "not-an-address", INGRESS, "10.42.3.4"),
        ("10.42.3.4", "203.0.113.9, junk", INGRESS, "10.42.3.4"),
        ("10.42.3.4", "10.42.5.5, 10.42.6.6", INGRESS, "10.42.5.5"),
        # IPv6, and IPv4 as an IPv6 socket reports it.
        ("::ffff:10.42.3.4", "2001:db8::7", INGRESS, "2001:db8::7"),
        ("2001:db8::1", "203.0.113.9", ("2001:db8::/64",), "203.0.113.9"),
        ("::ffff:192.0.2.5", "203.0.113.9", INGRESS, "192.0.2.5"),
        # A peer that is no address (a unix socket): nothing to count against.
        ("", "203.0.113.9", INGRESS, None),
    ],
)
def test_the_client_is_the_peer_unless_a_trusted_proxy_forwarded_it(peer, forwarded_for, proxies, client):
    assert forwarded_client(peer, forwarded_for, proxies) == client
