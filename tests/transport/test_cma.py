"""Connect by address: ``rdma_cm`` over two soft RoCE-UDP devices on loopback.

The CM MADs cross real UDP sockets through each device's QP1 (``gsi.py``);
the QPs the events set up then carry data, checked byte for byte.
"""

import ipaddress
import socket
import time
from collections.abc import Callable, Hashable, Iterator

import pytest

from rdmakit.engine import (
    SGE,
    Access,
    QpState,
    QueuePair,
    RecvWR,
    SendWR,
    WcStatus,
    WrOpcode,
)
from rdmakit.testing.cm_side import CmSide, until
from rdmakit.transport.cma import CmaEventKind
from rdmakit.wire import icrc_ipv4, pack_icrc
from rdmakit.wire.cm import CmaHeader, CmAttr, CmMad, PortSpace, RejReason, encode_cm, service_id
from rdmakit.wire.ud import GSI_QKEY, UdSend, encode_ud_send

PORT = 7174


def Side(ip: str, seed: int) -> CmSide:
    return CmSide(ip, seed, timeout_exponent=14, max_retries=4)


@pytest.fixture
def pair(new_ip: Callable[[], str]) -> Iterator[tuple[CmSide, CmSide]]:
    a, b = Side(new_ip(), 1), Side(new_ip(), 2)
    try:
        yield a, b
    finally:
        a.dev.close()
        b.dev.close()


def _connect(a: CmSide, b: CmSide, private: bytes = b"") -> tuple[QueuePair, QueuePair, int, int]:
    qa = a.qp()
    ha = a.cm.connect(b.dev.ip, PORT, qa, time.monotonic(), private_data=private)
    until((a, b), b.has(CmaEventKind.CONNECT_REQUEST))
    req = b.take(CmaEventKind.CONNECT_REQUEST)
    qb = b.qp()
    b.cm.accept(req.conn, qb, time.monotonic(), private_data=b"welcome")
    until((a, b), lambda: a.has(CmaEventKind.ESTABLISHED)() and b.has(CmaEventKind.ESTABLISHED)())
    ea, eb = a.take(CmaEventKind.ESTABLISHED), b.take(CmaEventKind.ESTABLISHED)
    assert ea.conn == ha
    assert ea.private_data.rstrip(b"\0") == b"welcome"
    assert eb.conn == req.conn
    return qa, qb, ha, req.conn


def _send(a: CmSide, b: CmSide, qa: QueuePair, qb: QueuePair, msg: bytes, base: int) -> None:
    src, dst = bytearray(msg), bytearray(len(msg))
    mra = a.dev.pd.register(src, base, Access.LOCAL_WRITE)
    mrb = b.dev.pd.register(dst, base + 0x10000, Access.LOCAL_WRITE)
    qb.post_recv(RecvWR(wr_id=7, sg_list=(SGE(base + 0x10000, len(dst), mrb.lkey),)))
    qa.post_send(SendWR(wr_id=8, opcode=WrOpcode.SEND, sg_list=(SGE(base, len(src), mra.lkey),)))
    got: list[int] = []

    def done() -> bool:
        got.extend(wc.wr_id for wc in a.cq.poll(8) + b.cq.poll(8) if wc.status is WcStatus.SUCCESS)
        return sorted(got) == [7, 8]

    until((a, b), done)
    assert bytes(dst) == msg


def test_connect_by_address_and_move_data(pair: tuple[CmSide, CmSide]) -> None:
    """rdma_connect → CONNECT_REQUEST (with the cma_hdr's port and the user's data) → accept → ESTABLISHED."""
    a, b = pair
    b.cm.listen(PORT)
    qa = a.qp()
    a.cm.connect(b.dev.ip, PORT, qa, time.monotonic(), private_data=b"hello")
    until((a, b), b.has(CmaEventKind.CONNECT_REQUEST))
    req = b.events[0]
    assert (req.peer_ip, req.listen_port) == (a.dev.ip, PORT)
    assert 32768 <= req.peer_port < 61000
    assert req.private_data.rstrip(b"\0") == b"hello"
    qb = b.qp()
    b.cm.accept(req.conn, qb, time.monotonic())
    until((a, b), lambda: a.has(CmaEventKind.ESTABLISHED)() and b.has(CmaEventKind.ESTABLISHED)())
    assert qa.state is QpState.RTS
    assert qb.state is QpState.RTS
    assert qa.attrs.dest_qpn == qb.qpn
    assert qb.attrs.dest_qpn == qa.qpn
    _send(a, b, qa, qb, b"ping over an rdma_cm connection", 0x1000)
    _send(b, a, qb, qa, b"and back", 0x4000)


def test_several_connections_each_carry_their_data(pair: tuple[CmSide, CmSide]) -> None:
    a, b = pair
    b.cm.listen(PORT)
    conns = [_connect(a, b, bytes([i])) for i in range(3)]
    for i, (qa, qb, _, _) in enumerate(conns):
        _send(a, b, qa, qb, f"connection {i}".encode() * 10, 0x100000 * (i + 1))
    assert len({qb.qpn for _, qb, _, _ in conns}) == 3


@pytest.mark.parametrize("who", ["active", "passive"])
def test_disconnect_from_either_side(pair: tuple[CmSide, CmSide], who: str) -> None:
    """rdma_disconnect: DREQ/DREP; both sides see DISCONNECTED and their QPs are in ERROR."""
    a, b = pair
    b.cm.listen(PORT)
    qa, qb, ha, hb = _connect(a, b)
    side, handle = (a, ha) if who == "active" else (b, hb)
    side.cm.disconnect(handle, time.monotonic())
    until((a, b), lambda: a.has(CmaEventKind.DISCONNECTED)() and b.has(CmaEventKind.DISCONNECTED)())
    assert qa.state is QpState.ERR
    assert qb.state is QpState.ERR


@pytest.mark.parametrize("who", ["active", "passive"])
def test_closing_a_device_disconnects_its_connections(pair: tuple[CmSide, CmSide], who: str) -> None:
    """A device closed with connections up (a program's exit) sends their DREQs first, as the
    kernel does for an exiting rdma_cm user: the peer sees DISCONNECTED for each, its QPs in ERROR."""
    a, b = pair
    b.cm.listen(PORT)
    conns = [_connect(a, b, bytes([i])) for i in range(2)]
    gone, peer = (a, b) if who == "active" else (b, a)
    gone.dev.close()
    until((peer,), peer.has(CmaEventKind.DISCONNECTED, 2))
    assert all(q.state is QpState.ERR for qa, qb, _, _ in conns for q in (qa, qb))


def test_no_listener_is_rejected_with_reason_8(pair: tuple[CmSide, CmSide]) -> None:
    a, b = pair
    a.cm.connect(b.dev.ip, 9, a.qp(), time.monotonic())
    until((a, b), a.has(CmaEventKind.REJECTED))
    assert a.events[0].reason == RejReason.INVALID_SERVICE_ID


def test_rdma_reject_carries_private_data(pair: tuple[CmSide, CmSide]) -> None:
    a, b = pair
    b.cm.listen(PORT)
    a.cm.connect(b.dev.ip, PORT, a.qp(), time.monotonic())
    until((a, b), b.has(CmaEventKind.CONNECT_REQUEST))
    b.cm.reject(b.events[0].conn, time.monotonic(), private_data=b"go away")
    until((a, b), a.has(CmaEventKind.REJECTED))
    rej = a.take(CmaEventKind.REJECTED)
    assert (rej.reason, rej.private_data.rstrip(b"\0")) == (RejReason.CONSUMER_DEFINED, b"go away")


def test_nobody_there_is_unreachable(new_ip: Callable[[], str]) -> None:
    a = Side(new_ip(), 3)
    try:
        a.cm.connect(new_ip(), PORT, a.qp(), time.monotonic())  # an address nothing listens on
        until((a,), a.has(CmaEventKind.UNREACHABLE), limit=20)
    finally:
        a.dev.close()


def _raw_req(src_ip: str, dst_ip: str, cma_dst: str, *, icrc_ok: bool = True) -> bytes:
    hdr = CmaHeader(src=ipaddress.ip_address(src_ip), dst=ipaddress.ip_address(cma_dst), src_port=1)
    values = {"local_comm_id": 5, "service_id": service_id(PortSpace.TCP, PORT), "local_qpn": 77}
    mad = encode_cm(CmMad(CmAttr.REQ, 1, values, hdr.encode()))
    body = encode_ud_send(UdSend(dest_qp=1, src_qp=1, qkey=GSI_QKEY, payload=mad))
    src = socket.inet_aton(src_ip)
    icrc = icrc_ipv4(src, socket.inet_aton(dst_ip), 4791, 4791, body, ident=0) ^ (0 if icrc_ok else 1)
    return body + pack_icrc(icrc)


def test_hostile_datagrams_to_qp1(pair: tuple[CmSide, CmSide]) -> None:
    """QP1 drops what rxe drops (bad ICRC, not UD, wrong Q_Key) and refuses a REQ for another address."""
    a, b = pair
    b.cm.listen(PORT)
    gsi = b.dev.gsi
    assert gsi is not None
    now = time.monotonic()
    b.dev.receive_datagram(_raw_req(a.dev.ip, b.dev.ip, b.dev.ip, icrc_ok=False), (a.dev.ip, 4791), now)
    assert gsi.counters.bad_icrc >= 1  # (1 in 65536 corruptions is explained by some IPv4 ID)
    junk = bytes([0x64, 0, 0xFF, 0xFF, 0, 0, 0, 1]) + bytes(40)
    b.dev.receive_datagram(junk, (a.dev.ip, 4791), now)
    b.dev.receive_datagram(_raw_req(a.dev.ip, b.dev.ip, "10.0.0.9"), (a.dev.ip, 4791), now)
    b.pump()
    assert b.events == []  # the REQ named another address: refused, not reported
    assert gsi.counters.mads_in == 1


def test_data_before_a_lost_rtu_establishes(pair: tuple[CmSide, CmSide]) -> None:
    """IBTA §12.9.7.2: the passive QP's first packet stands for a lost RTU (IB_EVENT_COMM_EST)."""
    a, b = pair
    b.cm.listen(PORT)
    polled = a.cm.cm.poll_transmit

    def without_rtu() -> list[tuple[Hashable, CmMad]]:
        return [(p, m) for p, m in polled() if m.attr is not CmAttr.RTU]

    a.cm.cm.poll_transmit = without_rtu  # type: ignore[method-assign]
    qa = a.qp()
    a.cm.connect(b.dev.ip, PORT, qa, time.monotonic())
    until((a, b), b.has(CmaEventKind.CONNECT_REQUEST))
    qb = b.qp()
    b.cm.accept(b.take(CmaEventKind.CONNECT_REQUEST).conn, qb, time.monotonic())
    until((a, b), a.has(CmaEventKind.ESTABLISHED))
    assert not b.has(CmaEventKind.ESTABLISHED)()
    _send(a, b, qa, qb, b"data, no RTU", 0x1000)
    until((a, b), b.has(CmaEventKind.ESTABLISHED))
