"""The TCP link under the soft devices: framing, grants, routes and prefaces."""

import socket
import time
from collections.abc import Callable

import pytest

from rdmakit.transport import tcp
from rdmakit.transport.tcp import TcpLink
from rdmakit.transport.tcp_limits import PREFACE_LEN, PREFACE_MAGIC, SECRET_LEN, Route
from rdmakit.wire import RETH, Opcode, Packet, decode

QPN = 0x10


def _poll_frames(link: TcpLink, timeout: float = 5.0, want: int = 1) -> list[tuple[bytes, str, object]]:
    out: list[tuple[bytes, str, object]] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end and len(out) < want:
        for frames, ip, dead in link.poll(time.monotonic()):
            out += [(bytes(f), ip, dead) for f in frames if isinstance(f, memoryview)]
            if dead is not None:
                out.append((b"", ip, dead))
        time.sleep(0.001)
    return out


def _route_to(b: TcpLink, qpn: int = QPN, mtu: int = 1 << 20) -> Route:
    return Route(b.ip, b.port, qpn, b.issue(qpn, mtu))


def test_tcp_frames_carry_packets_and_name_the_sender(new_ip: Callable[[], str]) -> None:
    a, b = TcpLink(new_ip(), 0), TcpLink(new_ip(), 0)
    try:
        big = bytes(range(256)) * 4096  # 1 MiB: larger than any RoCE MTU
        pkts = [
            Packet(Opcode.SEND_ONLY, QPN, 5, payload=b"abc"),
            Packet(Opcode.RDMA_WRITE_ONLY, QPN, 6, reth=RETH(0x1000, 7, len(big)), payload=big),
        ]
        a.send_packets(pkts, _route_to(b))
        got = _poll_frames(b, want=2)
        assert [ip for _, ip, _ in got] == [a.ip, a.ip]
        first, second = decode(got[0][0]), decode(got[1][0])
        assert bytes(first.payload) == b"abc"
        assert second.reth == RETH(0x1000, 7, len(big))
        assert bytes(second.payload) == big
        assert b.streams == 1
        assert b.pending == 0
    finally:
        a.close()
        b.close()


def test_tcp_peer_that_is_not_there_is_reported(new_ip: Callable[[], str]) -> None:
    a = TcpLink(new_ip(), 0)
    try:
        route = Route(new_ip(), 4791, QPN, bytes(SECRET_LEN))
        a.send_packets([Packet(Opcode.SEND_ONLY, QPN, 5, payload=b"abc")], route)
        got = _poll_frames(a)
        assert got
        assert got[-1][2] == route
    finally:
        a.close()


def test_tcp_stream_without_preface_is_dropped(new_ip: Callable[[], str]) -> None:
    b = TcpLink(new_ip(), 0)
    try:
        with socket.create_connection((b.ip, b.port)) as s:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\0" * PREFACE_LEN)
            end = time.monotonic() + 5
            while b.counters.tcp_bad_preface == 0 and time.monotonic() < end:
                list(b.poll(time.monotonic()))
                time.sleep(0.001)
        assert b.counters.tcp_bad_preface == 1
        assert b.pending == 0
        assert PREFACE_MAGIC.startswith(b"RDMAKIT")
    finally:
        b.close()


@pytest.mark.parametrize(
    ("route_qpn", "frame_qpn", "mtu", "payload", "refused"),
    [
        (QPN, QPN + 1, 4096, 10, "tcp_unauthorised"),  # the secret opens QPN, not QPN + 1
        (QPN, QPN, 4096, 4096 + 64, "tcp_bad_length"),  # beyond the grant's MTU and any header
    ],
    ids=["other-qpn", "over-mtu"],
)
def test_a_frame_the_grant_does_not_allow_closes_the_stream(
    new_ip: Callable[[], str], route_qpn: int, frame_qpn: int, mtu: int, payload: int, refused: str
) -> None:
    a, b = TcpLink(new_ip(), 0), TcpLink(new_ip(), 0)
    try:
        route = _route_to(b, route_qpn, mtu)
        ok = Packet(Opcode.SEND_ONLY, route_qpn, 1, payload=b"ok")
        bad = Packet(Opcode.SEND_ONLY, frame_qpn, 2, payload=b"x" * payload)
        a.send_packets([ok, bad], route)
        got = _poll_frames(b, want=2, timeout=2)
        assert [decode(f).psn for f, _, _ in got if f] == [1]  # the first frame only
        assert getattr(b.counters, refused) == 1
        assert b.streams == 0
    finally:
        a.close()
        b.close()


def test_a_revoked_grant_closes_its_stream_and_opens_nothing(new_ip: Callable[[], str]) -> None:
    a, b = TcpLink(new_ip(), 0), TcpLink(new_ip(), 0)
    try:
        route = _route_to(b)
        a.send_packets([Packet(Opcode.SEND_ONLY, QPN, 1, payload=b"1")], route)
        assert len(_poll_frames(b)) == 1
        b.revoke(QPN)
        assert b.streams == 0
        a.close_route(route)
        a.send_packets([Packet(Opcode.SEND_ONLY, QPN, 2, payload=b"2")], route)
        assert _poll_frames(b, timeout=1) == []
        assert b.counters.tcp_bad_secret == 1
    finally:
        a.close()
        b.close()


def test_authenticated_streams_are_limited(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tcp, "MAX_STREAMS", 1)
    a, b = TcpLink(new_ip(), 0), TcpLink(new_ip(), 0)
    try:
        first, second = _route_to(b, QPN), _route_to(b, QPN + 1)
        a.send_packets([Packet(Opcode.SEND_ONLY, QPN, 1, payload=b"1")], first)
        assert len(_poll_frames(b)) == 1
        a.send_packets([Packet(Opcode.SEND_ONLY, QPN + 1, 1, payload=b"2")], second)
        assert _poll_frames(b, timeout=1) == []
        assert b.counters.tcp_streams_refused == 1
        assert b.streams == 1
        a.send_packets([Packet(Opcode.SEND_ONLY, QPN, 2, payload=b"3")], first)
        got = [bytes(decode(f).payload) for f, _, _ in _poll_frames(b)]
        assert got == [b"3"]  # the first stream still works
    finally:
        a.close()
        b.close()
