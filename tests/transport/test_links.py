"""The socket links under the soft devices: UDP with GSO/GRO, TCP with framing."""

import socket
import time
from collections.abc import Callable

from rdmakit.transport.tcp import PREFACE_MAGIC, TcpLink
from rdmakit.transport.udp import UdpLink
from rdmakit.wire import RETH, Opcode, Packet, decode


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


def _poll_frames(link: TcpLink, timeout: float = 5.0, want: int = 1) -> list[tuple[bytes, str, object]]:
    out: list[tuple[bytes, str, object]] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end and len(out) < want:
        for frames, ip, dead in link.poll():
            out += [(bytes(f), ip, dead) for f in frames]
            if dead is not None:
                out.append((b"", ip, dead))
        time.sleep(0.001)
    return out


def test_tcp_frames_carry_packets_and_name_the_sender(new_ip: Callable[[], str]) -> None:
    a, b = TcpLink(new_ip(), 0), TcpLink(new_ip(), 0)
    try:
        big = bytes(range(256)) * 4096  # 1 MiB: larger than any RoCE MTU
        pkts = [
            Packet(Opcode.SEND_ONLY, 0x10, 5, payload=b"abc"),
            Packet(Opcode.RDMA_WRITE_ONLY, 0x10, 6, reth=RETH(0x1000, 7, len(big)), payload=big),
        ]
        a.send_packets(pkts, (b.ip, b.port))
        got = _poll_frames(b, want=2)
        assert [ip for _, ip, _ in got] == [a.ip, a.ip]
        first, second = decode(got[0][0]), decode(got[1][0])
        assert bytes(first.payload) == b"abc"
        assert second.reth == RETH(0x1000, 7, len(big))
        assert bytes(second.payload) == big
    finally:
        a.close()
        b.close()


def test_tcp_peer_that_is_not_there_is_reported(new_ip: Callable[[], str]) -> None:
    a = TcpLink(new_ip(), 0)
    try:
        a.send_packets([Packet(Opcode.SEND_ONLY, 0x10, 5, payload=b"abc")], (new_ip(), 4791))
        got = _poll_frames(a)
        assert got
        assert got[-1][2] is not None
    finally:
        a.close()


def test_tcp_stream_without_preface_is_dropped(new_ip: Callable[[], str]) -> None:
    b = TcpLink(new_ip(), 0)
    try:
        with socket.create_connection((b.ip, b.port)) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\0" * 32)
            end = time.monotonic() + 5
            while b.bad_prefaces == 0 and time.monotonic() < end:
                list(b.poll())
                time.sleep(0.001)
        assert b.bad_prefaces == 1
        assert PREFACE_MAGIC.startswith(b"RDMAKIT")
    finally:
        b.close()
