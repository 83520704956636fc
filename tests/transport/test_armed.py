"""The armed responder's own interface (``_fastpath.Armed``), beside the engine's proofs.

The seeded equivalence runs (``tests/engine/test_engine_small_native.py``,
``test_engine_small_tx.py``) show that an armed responder leaves every run as
the engine alone does. Here: the ACK it sends in one call is, byte for byte,
``encode`` of the ACK it would hand back plus the ICRC; a disarmed object
refuses everything; and the pure-Python codec never arms.
"""

import random
import socket
from collections.abc import Callable
from typing import Any

import pytest

from rdmakit.engine import SGE, CompletionQueue, QpStats, RecvWR, SendWR, WrOpcode
from rdmakit.engine.memory import ProtectionDomain
from rdmakit.testing.engine import ALL_ACCESS
from rdmakit.transport import fastpath
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.transport.roce_udp import UdpPort
from rdmakit.transport.small_ops import take_small
from rdmakit.wire import AETH, RETH, IcrcFlow, Opcode, Packet, encode, icrc_ipv4, pack_icrc
from tests.transport.sockets import udp_sink

native: Any = fastpath.native
native_only = pytest.mark.skipif(native is None, reason=f"native data plane: {fastpath.describe()}")


def _armed(held: tuple[int, int, int] | None, stats: QpStats | None = None) -> Any:
    pd = ProtectionDomain(random.Random(1))
    return native.Armed(0x11, 0x22, 5, 9, 1024, 0, pd.remote_table, 0x1F, pd, stats or QpStats(), held, None)


@native_only
@pytest.mark.parametrize("held", [(0, 0, 0), (0xFFFFFF, 0x1F, 0xFFFFFF), (77, 0x0C, 1234)])
def test_the_sent_ack_is_the_engines_ack(new_ip: Callable[[], str], held: tuple[int, int, int]) -> None:
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind((new_ip(), 0))
    rx = udp_sink(new_ip())
    try:
        (sip, sport), (dip, dport) = tx.getsockname(), rx.getsockname()
        src, dst = socket.inet_aton(sip), socket.inet_aton(dip)
        flow = IcrcFlow.ipv4(src, dst, sport, dport)
        stats = QpStats()
        sender = _armed(held, stats)
        assert sender.pending
        assert sender.send_ack(tx.fileno(), (dip, dport), False, flow.states, flow) == 0
        assert not sender.pending
        assert sender.send_ack(tx.fileno(), (dip, dport), False, flow.states, flow) == -1  # nothing held
        assert stats.packets_out == 1
        got = rx.recv(65536)
        ack = _armed(held).take_ack()
        psn, syndrome, msn = held
        assert ack == Packet(Opcode.ACKNOWLEDGE, 0x22, psn, aeth=AETH(syndrome, msn))
        assert ack.opcode is Opcode.ACKNOWLEDGE  # the enum member (Responder.queue_ack tests identity)
        body = encode(ack)
        assert got == body + pack_icrc(icrc_ipv4(src, dst, sport, dport, body, ident=0))
    finally:
        tx.close()
        rx.close()


@native_only
def test_a_disarmed_responder_refuses_everything() -> None:
    stats = QpStats()
    armed = _armed((3, 0, 4), stats)
    psn, msn, in_msg, _rkey, _va, _len, _off, _resid, gen, view, executed, ack = armed.disarm()
    assert (psn, msn, in_msg, gen, view, executed) == (5, 9, False, None, None, 0)
    assert ack == Packet(Opcode.ACKNOWLEDGE, 0x22, 3, aeth=AETH(0, 4))
    assert not armed.pending
    assert armed.take_ack() is None
    flow = IcrcFlow.ipv4(b"\x7f\0\0\1", b"\x7f\0\0\2", 4791, 4791)
    body = encode(Packet(Opcode.RDMA_WRITE_ONLY, 0x11, 5, reth=RETH(0, 1, 8), payload=bytes(8)))
    assert armed.rx(body + pack_icrc(flow.icrc_seg(0, body)), 0, flow.states, flow) is False
    with pytest.raises(RuntimeError):
        armed.disarm()
    assert stats.packets_out == 0


def test_the_python_codec_never_arms() -> None:
    """``RDMAKIT_PURE_PYTHON=1``'s codec offers no ``arm``: a WRITE ONLY goes the generic way."""
    assert fastpath.PYTHON.arm is None
    assert fastpath.PYTHON.arm_req is None  # nor a native completer for ACKs

    class _Qp:
        native = None

        def arm_ticket(self) -> None:
            raise AssertionError("no ticket is asked for without a native owner to give it to")

    data = bytes(64)
    assert take_small(fastpath.PYTHON, _Qp(), Opcode.RDMA_WRITE_ONLY, data, 0, {}, None, 0.0) == 0  # type: ignore[arg-type]


class _Codec:
    """The native codec with its device poll counted (``taken``), or taken away (``poll=False``)."""

    def __init__(self, poll: bool, arm_req: bool = True) -> None:
        self.native = fastpath.NATIVE
        self.taken = 0
        self.asleep = 0  # polls that took packets and left the active set empty
        self.poll_armed = self._poll if poll else None
        assert self.native is not None
        self.arm_req = self.native.arm_req if arm_req else None

    def _poll(self, *a: Any) -> Any:
        assert self.native is not None
        assert self.native.poll_armed is not None
        got = self.native.poll_armed(*a)
        self.taken += got[0]
        if got[0] and not a[3]:
            self.asleep += 1
        return got

    def __getattr__(self, name: str) -> Any:
        return getattr(self.native, name)


def _ping(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch, poll: bool, arm_req: bool = True
) -> tuple[Any, ...]:
    """150 WRITEs of 8 bytes from a at b, one at a time, a READ and a SEND now and then (they
    disarm b's responder); what both memories, the completions, b's responder and a's requester
    say after."""
    codec = _Codec(poll, arm_req)
    monkeypatch.setattr(fastpath, "CODEC", codec)
    # No safety net: the poll itself must wake the QP whose ACK it holds (``UdpPort.sweep``).
    monkeypatch.setattr(UdpPort, "sweep", lambda self: None)
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b, Driver() as drv:
        drv.add(a)
        drv.add(b)
        cqa, cqb = CompletionQueue(256), CompletionQueue(256)
        qa = a.create_qp(send_cq=cqa, recv_cq=cqa)
        qb = b.create_qp(send_cq=cqb, recv_cq=cqb)
        ma, mb = bytearray(random.Random(3).randbytes(4096)), bytearray(4096)
        mra = a.pd.register(ma, 0x1000, ALL_ACCESS)
        mrb = b.pd.register(mb, 0x9000, ALL_ACCESS)
        connect_qp(a, qa, 10, local_endpoint(b, qb, 20))
        connect_qp(b, qb, 20, local_endpoint(a, qa, 10))
        done = []
        for i in range(150):
            off = (i * 8) % 2048
            if i % 25 == 24:
                qb.post_recv(RecvWR(wr_id=i, sg_list=(SGE(0x9000 + 3000, 64, mrb.lkey),)))
                wr = SendWR(wr_id=i, opcode=WrOpcode.SEND, sg_list=(SGE(0x1000 + off, 8, mra.lkey),))
            elif i % 10 == 9:
                wr = SendWR(
                    wr_id=i, opcode=WrOpcode.RDMA_READ, sg_list=(SGE(0x1000 + 2048 + off, 8, mra.lkey),),
                    remote_addr=0x9000 + off - 8, rkey=mrb.rkey,
                )  # fmt: skip
            else:
                wr = SendWR(
                    wr_id=i, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000 + off, 8, mra.lkey),),
                    remote_addr=0x9000 + off, rkey=mrb.rkey,
                )  # fmt: skip
            qa.post_send(wr)
            assert drv.run_until(lambda: len(cqa) > 0, 10.0)
            done += [(wc.wr_id, wc.status, wc.opcode) for wc in cqa.poll()]
            done += [(wc.wr_id, wc.status, wc.opcode) for wc in cqb.poll()]
        qb.disarm()
        resp = qb.resp
        req = qa.req
        ra = (
            req.comp_psn,
            req.sent_hwm,
            req.next_idx,
            len(req.sq),
            req.retry_left,
            req.rexmit_deadline is None,
        )
        return bytes(ma), bytes(mb), done, resp.psn, resp.msn, req.req_psn, ra, codec.asleep, codec.taken


@native_only
def test_the_device_poll_equals_the_per_packet_path(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over two soft devices on loopback: with the device poll (b's WRITEs executed as they are
    read, no Python call each) and without it, the same memory, completions and responder."""
    with_poll = _ping(new_ip, monkeypatch, True)
    without = _ping(new_ip, monkeypatch, False)
    assert with_poll[:-2] == without[:-2]
    assert without[-1] == 0
    assert with_poll[-1] > 100  # most WRITEs were taken by it
    assert with_poll[3] == with_poll[5]  # b expects what a sends next


@native_only
def test_the_device_poll_takes_the_requesters_acks(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the requester's native completer (``ArmedReq``) in the device poll and without it: the
    same memory, completions (in order), responder and requester state; and the poll took the
    ACKs of a's SENDs and WRITEs besides b's WRITEs."""
    on = _ping(new_ip, monkeypatch, True)
    off = _ping(new_ip, monkeypatch, True, arm_req=False)
    assert on[:-2] == off[:-2]
    assert on[6][3] == 0  # every WQE completed
    assert on[-1] > off[-1] + 100, (on[-1], off[-1])  # most of a's 135 SEND/WRITE ACKs too


@native_only
def test_the_device_poll_wakes_the_responder_it_took_a_write_for(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll that took an armed responder's WRITE leaves that QP in the port's active set: it
    holds the WRITE's ACK, which only a visit of the QP sends (the requester's completer is off,
    so what the poll took are b's WRITEs alone, and no sweep puts the QP back)."""
    got = _ping(new_ip, monkeypatch, True, arm_req=False)
    assert got[-2] == 0, got[-2:]  # every poll that took a WRITE woke b's QP
    assert got[-1] > 100  # and the poll took most WRITEs
