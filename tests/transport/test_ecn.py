"""ECN on the UDP port (RoCEv2 Annex A17.9): ECT(0) out, CE in, CNPs both ways, over loopback.

No queue on loopback marks CE, so the sending device marks its own datagrams CE
(its socket's TOS), standing in for a congested switch: the receiving QP owes
its peer a CNP, sends it, and the sender's DCQCN rate starts pacing it.
"""

import socket
import time
from collections.abc import Callable

import pytest

from rdmakit.transport.cnp import check_cnp, cnp_datagram
from rdmakit.transport.port import addr_bytes
from rdmakit.transport.udp import CE, ECT0, IP_RECVTOS, UdpLink
from tests.security.hostile import connected_pair


def test_datagrams_leave_marked_ect0(new_ip: Callable[[], str]) -> None:
    src, dst = new_ip(), new_ip()
    link = UdpLink(src, 0)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind((dst, 0))
        rx.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        rx.settimeout(5)
        assert link.ecn
        assert link.send([b"x" * 40], rx.getsockname())
        _, anc, _, _ = rx.recvmsg(100, socket.CMSG_SPACE(4))
        tos = [d[0] for level, typ, d in anc if (level, typ) == (socket.IPPROTO_IP, socket.IP_TOS)]
        assert tos == [ECT0]
    finally:
        link.close()
        rx.close()


@pytest.mark.parametrize("native", [True, False])
def test_ce_brings_a_cnp_that_paces_the_sender(new_ip: Callable[[], str], native: bool) -> None:
    p = connected_pair(new_ip, native)
    try:
        assert p.a.udp is not None
        p.a.udp.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, CE)
        p.transfer(64 * 1024)
        end = time.monotonic() + 10
        while not p.qa.stats.cnps_received and time.monotonic() < end:
            p.drv.progress()
            time.sleep(0.001)
        assert p.b.udp is not None
        assert p.b.udp.counters.ce_reads > 0
        assert p.qb.stats.ce_received > 0
        assert p.qb.stats.cnps_sent > 0
        assert p.qa.stats.cnps_received > 0
        assert p.qa.req.rate.rate is not None  # DCQCN paces the requester from now on
        p.transfer(256 * 1024, seed=2)  # and the paced QP still moves every byte
    finally:
        p.close()


def test_a_cnp_is_checked(new_ip: Callable[[], str]) -> None:
    """A CNP must carry a good ICRC and its BECN bit; anything else is refused, not raised."""
    a, b = new_ip(), new_ip()
    body, icrc = cnp_datagram(addr_bytes(a), b, 4791, 0x123456)
    good = memoryview(body + icrc)
    assert check_cnp(good, a, 4791, addr_bytes(b), 4791) == 0x123456
    bad = bytearray(good)
    bad[20] ^= 1
    assert check_cnp(memoryview(bytes(bad)), a, 4791, addr_bytes(b), 4791) is None
    assert check_cnp(good[:-1], a, 4791, addr_bytes(b), 4791) is None
    assert check_cnp(good, "not an address", 4791, addr_bytes(b), 4791) is None
