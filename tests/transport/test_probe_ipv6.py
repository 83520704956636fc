"""The conformance tester's link over IPv6: each datagram's fixed IPv6 header, rebuilt from the
kernel's ancillary data, carries the traffic class, flow label and hop limit it was sent with."""

import socket
from collections.abc import Iterator

import pytest

from rdmakit.transport.probe import ProbeLink


@pytest.fixture
def links() -> Iterator[tuple[ProbeLink, ProbeLink]]:
    try:
        a = ProbeLink("::1", 0)
    except OSError as e:
        pytest.skip(f"IPv6 is unavailable on this host: {e}")
    b = ProbeLink("::1", 0)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("tclass", "hop", "label"), [(0, 64, 0x12345), (0xB9, 1, 0xFEDCB), ((10 << 2) | 1, 255, 1), (3, 7, 0)]
)
def test_the_header_carries_what_was_sent(
    links: tuple[ProbeLink, ProbeLink], tclass: int, hop: int, label: int
) -> None:
    a, b = links
    assert a.sees_ip_headers
    assert a.header_source.startswith("IPv6 header")
    payload = bytes(range(37))
    a.send(payload, (b.ip, b.port), tclass, hop, label)
    d = b.recv(2.0)
    assert d is not None
    assert (d.src_ip, d.sport, d.payload) == ("::1", a.port, payload)
    h = d.ip_header
    assert h is not None
    assert len(h) == 40
    first = int.from_bytes(h[:4], "big")
    assert first >> 28 == 6
    assert first >> 20 & 0xFF == tclass
    if label:  # 0: the kernel's own (net.ipv6.auto_flowlabels), whatever it is
        assert first & 0xFFFFF == label
    assert int.from_bytes(h[4:6], "big") == 8 + len(payload)
    assert (h[6], h[7]) == (17, hop)
    assert h[8:24] == h[24:40] == socket.inet_pton(socket.AF_INET6, "::1")


def test_a_flow_label_needs_ipv6_and_20_bits(links: tuple[ProbeLink, ProbeLink]) -> None:
    a, b = links
    with pytest.raises(ValueError, match="20-bit"):
        a.send(b"x" * 16, (b.ip, b.port), flow_label=1 << 20)
    v4 = ProbeLink("127.0.0.1", 0, raw=False)
    try:
        with pytest.raises(ValueError, match="20-bit"):
            v4.send(b"x" * 16, ("127.0.0.1", v4.port), flow_label=5)
    finally:
        v4.close()
