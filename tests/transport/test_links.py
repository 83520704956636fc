"""The UDP link under the soft devices: GSO sends, GRO receives (TCP: test_tcp_link.py)."""

import time
from collections.abc import Callable

from rdmakit.transport.udp import UdpLink


def _recv_all(link: UdpLink, want: int, timeout: float = 5.0) -> list[tuple[bytes, tuple[str, int]]]:
    got: list[tuple[bytes, tuple[str, int]]] = []
    end = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < end:
        r = link.recv()
        if r is None:
            time.sleep(0.001)
            continue
        segs, addr = r
        got += [(bytes(s), addr) for s in segs]
    return got


def test_udp_gso_batch_arrives_as_separate_datagrams(new_ip: Callable[[], str]) -> None:
    a, b = UdpLink(new_ip()), UdpLink(new_ip())
    try:
        segs = [bytes([i]) * 1000 for i in range(14)] + [b"\xee" * 300]
        if a.gso:
            assert a.send_gso(segs, 1000, len(segs), (b.ip, b.port))
        else:
            for s in segs:
                assert a.send([s], (b.ip, b.port))
        got = _recv_all(b, len(segs))
        assert [g for g, _ in got] == segs
        assert {addr for _, addr in got} == {(a.ip, a.port)}  # sent from exactly our address
        assert b.counters.datagrams_in == len(segs)
    finally:
        a.close()
        b.close()


def test_udp_link_reports_empty_and_survives_icmp_errors(new_ip: Callable[[], str]) -> None:
    a = UdpLink(new_ip())
    try:
        assert a.recv() is None
        # Nobody listens there: the port-unreachable error comes back on a later call.
        a.send([b"x" * 40], (new_ip(), 4791))
        time.sleep(0.01)
        for _ in range(3):
            a.recv()
        assert a.recv() is None
    finally:
        a.close()
