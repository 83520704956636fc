"""The ACKs of many QPs to one peer leave a transmit pass together (``UdpPort._send_acks``).

Each QP still owes its peer its own ACK: after one poll that executed WRITEs
on many QPs, those ACKs leave as one GSO send and arrive as one GRO read.
None of them waits past the pass that made it, and a QP with more to send in
the same pass sends its ACK first, in its own order.
"""

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from rdmakit.engine import SGE, QueuePair, SendWR, WcStatus, WrOpcode
from rdmakit.transport import fastpath
from rdmakit.transport.device import SoftDevice
from rdmakit.wire import IcrcFlow, encode, icrc_ipv4, pack_icrc
from tests.transport.sockets import udp_sink
from tests.transport.test_armed import _armed
from tests.transport.test_deadlines import _ALL, _connect

_N, _SIZE = 16, 6000  # two packets each at MTU 4096


def _post_writes(
    a: SoftDevice, b: SoftDevice, pairs: list[tuple[QueuePair, QueuePair]]
) -> tuple[bytearray, bytearray]:
    src, dst = bytearray(_SIZE * len(pairs)), bytearray(_SIZE * len(pairs))
    mra = a.pd.register(src, 0x10_0000, _ALL)
    mrb = b.pd.register(dst, 0x90_0000, _ALL)
    for i, (qa, _qb) in enumerate(pairs):
        src[i * _SIZE : (i + 1) * _SIZE] = bytes([i + 1]) * _SIZE
        qa.post_send(
            SendWR(
                wr_id=i, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(mra.addr + i * _SIZE, _SIZE, mra.lkey),),
                remote_addr=mrb.addr + i * _SIZE, rkey=mrb.rkey,
            )
        )  # fmt: skip
    return src, dst


def _complete(dev: SoftDevice, qp: QueuePair, n: int) -> list[WcStatus]:
    done: list[WcStatus] = []
    give_up = time.monotonic() + 30.0
    while len(done) < n and time.monotonic() < give_up:
        dev.progress(time.monotonic())
        done += [wc.status for wc in qp.send_cq.poll(n)]
    return done


@pytest.mark.parametrize("armed", [True, False], ids=["armed", "engine"])
def test_the_acks_of_many_qps_leave_in_one_send_and_arrive_in_one_read(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch, armed: bool
) -> None:
    """Each of 16 QPs owes an ACK for a two-packet WRITE after one poll: the responder sends
    them as one GSO batch, and the requester reads them as one GRO batch and completes all 16.
    The ACKs are held by armed responders, or (arming off) built by the engine."""
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b:
        port = b.udp_port
        assert port is not None
        if port.codec.arm is None:
            pytest.skip("the native data plane is not built")
        if not armed:
            monkeypatch.setattr(port.codec, "arm", None)
        pairs = _connect(a, b, _N)
        src, dst = _post_writes(a, b, pairs)
        a.progress(time.monotonic())  # 32 datagrams, in b's socket when the sends return
        assert a.udp is not None
        assert b.udp is not None
        bc, ac = b.udp.counters, a.udp.counters
        sends, out = bc.sends, bc.datagrams_out
        b.progress(time.monotonic())
        assert bc.datagrams_in == 2 * _N
        assert bc.datagrams_out - out == _N
        assert bc.sends - sends == 1
        assert not any(qb.native is not None and qb.native.pending for _qa, qb in pairs)  # none left held
        assert a.udp_port is not None
        dc = a.udp_port.counters
        checked = dc.icrc_ok
        assert _complete(a, pairs[0][0], _N) == [WcStatus.SUCCESS] * _N
        assert ac.datagrams_in == _N
        assert ac.gro_batches == 1
        # Each segment's ICRC checks with the IPv4 ID its place in the batch gives it.
        assert dc.icrc_ok - checked == _N
        assert (dc.icrc_solved, dc.solver_runs, dc.bad_icrc) == (0, 0, 0)
        assert dst == src
        assert any(qb.native is not None for _qa, qb in pairs) is armed


def test_a_qp_with_more_to_send_is_not_held_back(new_ip: Callable[[], str]) -> None:
    """The far side has WRITEs of its own posted on every QP: in the poll that executes
    the near side's WRITEs, each QP sends its ACK and its own WRITE's packets, none held."""
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b:
        pairs = _connect(a, b, _N)
        src, dst = _post_writes(a, b, pairs)
        back = [(qb, qa) for qa, qb in pairs]
        src2, dst2 = _post_writes(b, a, back)
        assert b.udp is not None
        bc = b.udp.counters
        a.progress(time.monotonic())
        out = bc.datagrams_out
        b.progress(time.monotonic())
        assert bc.datagrams_out - out == 3 * _N  # the 16 ACKs and 32 WRITE packets
        assert _complete(a, pairs[0][0], _N) == [WcStatus.SUCCESS] * _N
        assert _complete(b, pairs[0][1], _N) == [WcStatus.SUCCESS] * _N
        assert (dst, dst2) == (src, src2)


native: Any = fastpath.native


@pytest.mark.skipif(native is None, reason=f"native data plane: {fastpath.describe()}")
@pytest.mark.parametrize("gso", [True, False])
def test_send_acks_sends_each_held_ack_as_the_engine_encodes_it(new_ip: Callable[[], str], gso: bool) -> None:
    """Three responders hold ACKs, a fourth none: three segments leave, segment k with the
    ICRC of IPv4 ID k in a GSO batch (ID 0 each, one by one), and nothing stays held."""
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind((new_ip(), 0))
    rx = udp_sink(new_ip())
    try:
        (sip, sport), (dip, dport) = tx.getsockname(), rx.getsockname()
        src, dst = socket.inet_aton(sip), socket.inet_aton(dip)
        flow = IcrcFlow.ipv4(src, dst, sport, dport)
        helds = [(5, 0, 9), None, (0xFFFFFF, 0x1F, 0xFFFFFF), (77, 0x0C, 1234)]
        owners = [_armed(h) for h in helds]
        sent, sends, err = native.send_acks(tx.fileno(), (dip, dport), False, gso, flow.states, flow, owners)
        assert (sent, sends, err) == (3, 1 if gso else 3, 0)
        assert not any(o.pending for o in owners)
        for k, held in enumerate(h for h in helds if h is not None):
            body = encode(_armed(held).take_ack())
            got = rx.recv(65536)
            assert got == body + pack_icrc(icrc_ipv4(src, dst, sport, dport, body, ident=k if gso else 0))
        assert native.send_acks(tx.fileno(), (dip, dport), False, gso, flow.states, flow, owners) == (0, 0, 0)
    finally:
        tx.close()
        rx.close()


@pytest.mark.skipif(native is None, reason=f"native data plane: {fastpath.describe()}")
def test_send_acks_refuses_what_is_not_a_list_of_responders(new_ip: Callable[[], str]) -> None:
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind((new_ip(), 0))
    flow = IcrcFlow.ipv4(socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.1"), 1, 2)
    try:
        held = _armed((5, 0, 9))
        for owners in ([held, object()], (held,), [None]):
            with pytest.raises(TypeError):
                native.send_acks(tx.fileno(), ("127.0.0.1", 9), False, True, flow.states, flow, owners)
        assert held.pending  # nothing sent: the bad entry came after it, but before the send
    finally:
        tx.close()
