"""IPv6 datagrams with UDP checksum 0, as Linux rxe sends RoCEv2 over IPv6 (``rxe_net.c``
``prepare_udp_hdr()``), reach a soft device's link and the conformance tester's link: a plain
IPv6 UDP socket would drop them (RFC 8200 §8.1), and rdmakit would hear nothing from rxe."""

import os
import socket
import struct
import time

import pytest

from rdmakit.transport.probe import ProbeLink
from rdmakit.transport.udp import UdpLink

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a hand-made UDP header needs a raw socket (root)")

PAYLOAD = bytes(range(40))


def _send_zero_checksum(port: int) -> None:
    try:
        raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
    except OSError as e:
        pytest.skip(f"IPv6 is unavailable on this host: {e}")
    try:
        raw.sendto(struct.pack(">HHHH", 4791, port, 8 + len(PAYLOAD), 0) + PAYLOAD, ("::1", 0))
    finally:
        raw.close()


def test_the_probe_link_takes_it() -> None:
    with ProbeLink("::1", 0) as link:
        _send_zero_checksum(link.port)
        d = link.recv(2.0)
        assert d is not None
        assert d.payload == PAYLOAD


def test_a_soft_device_link_takes_it() -> None:
    link = UdpLink("::1", 0)
    try:
        _send_zero_checksum(link.port)
        got = None
        deadline = time.monotonic() + 2.0
        while got is None and time.monotonic() < deadline:
            got = link.recv()
            if got is None:
                time.sleep(0.01)
        assert got is not None
        segments, _src = got
        assert b"".join(bytes(s) for s in segments) == PAYLOAD
    finally:
        link.close()
