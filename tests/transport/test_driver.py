"""The drivers: one pollable descriptor for event-driven mode, and the trio pump."""

import select
from collections.abc import Callable, Iterator

import pytest
import trio

from rdmakit.engine import SGE, Access, Completion, CompletionQueue, QueuePair, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import until_completions
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver, TrioDriver


class Pair:
    def __init__(self, ip_a: str, ip_b: str) -> None:
        self.a, self.b = SoftDevice(ip_a), SoftDevice(ip_b)
        self.cqa, self.cqb = CompletionQueue(64), CompletionQueue(64)
        self.qa: QueuePair = self.a.create_qp(send_cq=self.cqa, recv_cq=self.cqa)
        self.qb: QueuePair = self.b.create_qp(send_cq=self.cqb, recv_cq=self.cqb)
        connect_qp(self.a, self.qa, 1, local_endpoint(self.b, self.qb, 2))
        connect_qp(self.b, self.qb, 2, local_endpoint(self.a, self.qa, 1))
        self.src = bytearray(b"driver!!" * 512)
        self.dst = bytearray(len(self.src))
        self.mra = self.a.pd.register(self.src, 0x1000, Access.LOCAL_WRITE)
        self.mrb = self.b.pd.register(self.dst, 0x8000, Access.LOCAL_WRITE | Access.REMOTE_WRITE)

    def write(self, wr_id: int = 1) -> None:
        sge = SGE(0x1000, len(self.src), self.mra.lkey)
        wr = SendWR(
            wr_id=wr_id, opcode=WrOpcode.RDMA_WRITE, sg_list=(sge,), remote_addr=0x8000, rkey=self.mrb.rkey
        )
        self.qa.post_send(wr)

    def close(self) -> None:
        self.a.close()
        self.b.close()


@pytest.fixture
def pair(new_ip: Callable[[], str]) -> Iterator[Pair]:
    p = Pair(new_ip(), new_ip())
    yield p
    p.close()


def test_fileno_wakes_for_packets_with_select_and_epoll(pair: Pair) -> None:
    """Event-driven mode: wait on one descriptor, then progress; no busy loop."""
    drv = Driver()
    drv.add(pair.a)
    drv.add(pair.b)
    pair.write()
    done: list[Completion] = []
    ep = select.epoll()
    ep.register(drv.fileno(), select.EPOLLIN)
    rounds = 0
    while not done:
        rounds += 1
        assert rounds < 1000
        drv.progress()
        done += pair.cqa.poll(1)
        if done:
            break
        # Alternate the two waiting styles an application might use.
        if rounds % 2:
            r, _, _ = select.select([drv], [], [], 10)
            assert r == [drv], "the descriptor never became readable"
        else:
            assert ep.poll(10), "the descriptor never became readable"
    ep.close()
    drv.close()
    assert done[0].status is WcStatus.SUCCESS
    assert pair.dst == pair.src


def test_fileno_wakes_at_an_engine_deadline(new_ip: Callable[[], str]) -> None:
    """With no packets at all (the peer is gone), the timerfd wakes the waiter to retransmit."""
    a = SoftDevice(new_ip())
    cq = CompletionQueue(8)
    qp = a.create_qp(send_cq=cq, recv_cq=cq)
    ghost = SoftDevice(new_ip())
    gq = ghost.create_qp(send_cq=CompletionQueue(8), recv_cq=CompletionQueue(8))
    ep = local_endpoint(ghost, gq, 5)
    ghost.close()  # nobody answers at that address
    connect_qp(a, qp, 7, ep)
    buf = bytearray(64)
    mr = a.pd.register(buf, 0x1000, Access.LOCAL_WRITE)
    qp.post_send(SendWR(wr_id=9, opcode=WrOpcode.SEND, sg_list=(SGE(0x1000, 64, mr.lkey),)))
    drv = Driver()
    drv.add(a)
    wakeups = 0
    done: list[Completion] = []
    while not done:
        drv.progress()
        done += cq.poll(1)
        if done:
            break
        deadline = drv.next_deadline()
        assert deadline is not None, "an unacknowledged send must have a retransmit deadline"
        r, _, _ = select.select([drv], [], [], 30)
        assert r, "the timerfd did not fire"
        wakeups += 1
    drv.close()
    a.close()
    assert done[0].status is WcStatus.RETRY_EXC_ERR
    assert wakeups >= 6  # one wake-up per retransmit timeout (retry_cnt 6), no spinning
    assert qp.stats.retransmits >= 6


async def test_trio_driver_completes_writes_without_busy_waiting(pair: Pair) -> None:
    drv = Driver()
    drv.add(pair.a)
    drv.add(pair.b)
    async with TrioDriver(drv) as td:
        done: list[Completion] = []
        for i in range(5):
            pair.write(i)
            td.kick()
            await td.wait_for(until_completions(pair.cqa, done, i + 1))
        # Meanwhile other trio tasks ran: the pump awaits readiness, not a spin.
        with trio.fail_after(10):
            await trio.sleep(0)
    drv.close()
    assert [wc.wr_id for wc in done] == [0, 1, 2, 3, 4]
    assert all(wc.status is WcStatus.SUCCESS for wc in done)
    assert pair.dst == pair.src
