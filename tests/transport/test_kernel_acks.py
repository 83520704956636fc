"""A kernel requester's packets (one datagram each, rxe's own IPv4 IDs) are acknowledged as the
responder executes them, not only where rxe asks (every 64 packets, or a message's end).

rxe restarts its retransmit timer on every ACK that makes progress (rxe_comp.c) and keeps at
most 128 PSNs unacknowledged. A receiver that takes each of rxe's datagrams in a system call
of its own may need longer for a window than rxe's timer (67 ms by default) allows; an ACK
every ``KERNEL_ACK_EVERY`` PSNs, sent before the next datagram is read, keeps the timer
from firing while the responder works through the window.
"""

from collections.abc import Callable, Iterator

import pytest

import tests.transport.test_faults as faults
from rdmakit.engine import SGE, Access, Completion, CompletionQueue, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import until_completions
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.transport.roce_udp import KERNEL_ACK_EVERY

MTU = 1024
#: Packets of the one WRITE: two unasked ACKs' worth and a few more; the last asks (AckReq).
PACKETS = 2 * KERNEL_ACK_EVERY + 5


@pytest.fixture(params=[False, pytest.param(True, marks=faults.needs_native)], ids=["python", "native"])
def pair(
    new_ip: Callable[[], str], request: pytest.FixtureRequest
) -> Iterator[tuple[SoftDevice, SoftDevice]]:
    a = SoftDevice(new_ip(), gso=False, bulk=request.param)
    b = SoftDevice(new_ip(), gso=False, bulk=request.param)
    yield a, b
    a.close()
    b.close()


def test_a_kernel_requesters_window_is_acknowledged_as_it_is_executed(
    pair: tuple[SoftDevice, SoftDevice], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    kernel = faults.KernelIds(a, 0x1234, {})
    kernel.install(monkeypatch)
    cqa, cqb = CompletionQueue(16), CompletionQueue(16)
    qa, qb = a.create_qp(send_cq=cqa, recv_cq=cqa), b.create_qp(send_cq=cqb, recv_cq=cqb)
    connect_qp(a, qa, 100, local_endpoint(b, qb, 200, MTU))
    connect_qp(b, qb, 200, local_endpoint(a, qa, 100, MTU))
    size = PACKETS * MTU
    src, dst = bytearray(range(256)) * (size // 256), bytearray(size)
    mra = a.pd.register(src, 0x1_0000, Access.LOCAL_WRITE)
    mrb = b.pd.register(dst, 0x9_0000, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    qa.post_send(SendWR(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(mra.addr, size, mra.lkey),),
                        remote_addr=mrb.addr, rkey=mrb.rkey))  # fmt: skip
    # The whole window leaves before the responder reads any of it (loopback queues it in
    # b's socket), as a window of rxe's reaches a receiver that is still busy.
    now = 0.0
    while len(kernel.sent) < PACKETS:
        now += 1e-4
        assert a.progress(now) or len(kernel.sent) == PACKETS
    assert len(kernel.sent) == PACKETS
    assert b.counters.packets_in == 0
    # One pass of the responder: it stops reading once KERNEL_ACK_EVERY PSNs are executed and
    # their ACK is owed, and the ACK leaves in the same pass.
    b.progress(now)
    assert b.counters.packets_in == KERNEL_ACK_EVERY
    assert b.counters.packets_out == 1
    assert bytes(dst[: KERNEL_ACK_EVERY * MTU]) == bytes(src[: KERNEL_ACK_EVERY * MTU])
    assert bytes(dst[KERNEL_ACK_EVERY * MTU :]) == bytes(size - KERNEL_ACK_EVERY * MTU)  # not read yet
    a.progress(now)
    assert qa.req.comp_psn == 100 + KERNEL_ACK_EVERY  # the requester's window moved on
    b.progress(now)
    assert b.counters.packets_in == 2 * KERNEL_ACK_EVERY
    assert b.counters.packets_out == 2
    # The rest, up to the packet that asks: its ACK, and no unasked one besides.
    drv = Driver()
    drv.add(a)
    drv.add(b)
    got: list[Completion] = []
    assert drv.run_until(until_completions(cqa, got), 30)
    drv.close()
    assert got[0].status is WcStatus.SUCCESS
    assert dst == src
    assert b.counters.packets_in == PACKETS
    assert b.counters.packets_out == 3
    assert (b.counters.icrc_solved, b.counters.bad_icrc) == (PACKETS, 0)
