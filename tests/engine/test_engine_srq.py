"""The shared receive queue (IBTA Vol. 1 §10.2.9, ``ibv_create_srq``): several RC QPs, one queue.

Two requesters on their own addresses send to two responder QPs that take
their receive WQEs from one SRQ, over a seeded hostile `SimNet`: every
message lands once, in a WQE of the SRQ, and its completion names the QP it
came on. Then the limits, the limit event, RNR on an empty SRQ and the
Error state's flush, each as rxe and ``ibv_modify_qp``(3) have them.
"""

import random
from dataclasses import dataclass

import pytest

from rdmakit.engine import (
    SGE,
    Completion,
    CompletionQueue,
    EngineError,
    ProtectionDomain,
    QpCaps,
    QpState,
    QueuePair,
    RecvWR,
    SharedReceiveQueue,
    SrqEvent,
    SrqEventKind,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from rdmakit.testing.engine import ALL_ACCESS, BASE_ADDR, Side, connect, make_side, send_wr
from rdmakit.testing.faults import CLEAN, MIXED
from rdmakit.transport.simnet import Faults, SimNet

SLOT = 512  # bytes of the responder's memory per receive WQE


@dataclass
class Bed:
    net: SimNet
    senders: list[Side]
    qps: list[QueuePair]  # the responder's, both on `srq`
    srq: SharedReceiveQueue
    rcq: CompletionQueue
    pd: ProtectionDomain
    mem: bytearray
    lkey: int


def make_bed(seed: int, faults: Faults, *, max_wr: int = 64, rnr_retry: int = 7) -> Bed:
    rng = random.Random(seed)
    print(f"seed {seed}")
    net = SimNet(seed, faults)
    pd = ProtectionDomain(rng)
    mem = bytearray(max_wr * SLOT)
    mr = pd.register(mem, BASE_ADDR, ALL_ACCESS)
    srq = SharedReceiveQueue(pd, max_wr=max_wr, max_sge=2)
    rcq = CompletionQueue(4096)
    qps, senders = [], []
    for i in range(2):
        qp = QueuePair(
            pd, qpn=0x100 + i, send_cq=CompletionQueue(4096), recv_cq=rcq, caps=QpCaps(), rng=rng, srq=srq
        )
        side = make_side(f"a{i}", rng, 1 << 14, QpCaps(), 4096)
        connect(side.qp, qp, rng, mtu=256, rnr_retry=rnr_retry, remotes=(f"b{i}", f"a{i}"))
        net.attach(f"a{i}", side.qp)
        net.attach(f"b{i}", qp)
        qps.append(qp)
        senders.append(side)
    return Bed(net, senders, qps, srq, rcq, pd, mem, mr.lkey)


def until_received(bed: Bed, got: list[Completion], n: int) -> bool:
    """Run the network until `n` receive completions are in `got`."""

    def landed() -> bool:
        got.extend(bed.rcq.poll(8))
        return len(got) >= n

    return bed.net.run(until=landed, max_time=5.0)


def post_slots(bed: Bed, first: int, n: int) -> None:
    for k in range(first, first + n):
        half = SLOT // 2  # two SGEs per WQE: the scatter path too
        sges = (SGE(BASE_ADDR + k * SLOT, half, bed.lkey), SGE(BASE_ADDR + k * SLOT + half, half, bed.lkey))
        bed.srq.post_recv(RecvWR(wr_id=k, sg_list=sges))


@pytest.mark.parametrize("seed", [1, 7, 31])
def test_two_qps_share_one_srq_on_a_hostile_network(seed: int) -> None:
    bed = make_bed(seed, MIXED)
    post_slots(bed, 0, 40)
    rng = random.Random(seed)
    expect: dict[bytes, int] = {}  # message -> the responder QP it was sent to
    for i, side in enumerate(bed.senders):
        side.mem[:] = rng.randbytes(len(side.mem))
        for m in range(20):
            n = rng.randrange(1, SLOT + 1)  # up to two packets at MTU 256
            off = rng.randrange(0, len(side.mem) - n)
            op = WrOpcode.SEND if m % 3 else WrOpcode.SEND_WITH_IMM
            kw = {"imm_data": m} if op is WrOpcode.SEND_WITH_IMM else {}
            side.qp.post_send(send_wr(m, op, (side.sge(off, n),), **kw))
            expect[bytes(side.mem[off : off + n])] = bed.qps[i].qpn
    got: list[Completion] = []

    def done() -> bool:
        got.extend(bed.rcq.poll(1 << 10))
        for side in bed.senders:
            side.drain()
        return len(got) >= 40 and all(len(side.sent) >= 20 for side in bed.senders)

    assert bed.net.run(until=done, max_time=30.0), f"{len(got)} of 40 receives completed"
    assert all(c.status is WcStatus.SUCCESS for c in got)
    assert sorted(c.wr_id for c in got) == list(range(40))  # every WQE used once
    for c in got:
        data = bytes(bed.mem[c.wr_id * SLOT : c.wr_id * SLOT + c.byte_len])
        assert expect.pop(data) == c.qp_num, "a message's completion names the QP it came on"
    assert not expect
    per_qp = {qp.qpn: sum(c.qp_num == qp.qpn for c in got) for qp in bed.qps}
    assert per_qp == {qp.qpn: 20 for qp in bed.qps}
    for side in bed.senders:
        assert [c.status for c in side.sent] == [WcStatus.SUCCESS] * 20
    assert bed.net.stats["lost"]
    assert bed.net.stats["corrupted"]
    # The SRQ's WQEs are every QP's: its QPs advertise no end-to-end credits (0x1F), so
    # neither requester counted any (IBTA §10.2.9).
    assert all(side.qp.req.credits.unlimited for side in bed.senders)


def test_an_empty_srq_is_rnr_and_a_later_post_lets_the_message_in() -> None:
    bed = make_bed(5, CLEAN)
    a = bed.senders[0]
    a.mem[:4] = b"late"
    a.qp.post_send(send_wr(1, WrOpcode.SEND, (a.sge(0, 4),)))
    bed.net.run(max_time=0.01)
    assert bed.qps[0].stats.rnr_naks_sent >= 1
    assert not bed.rcq.poll(8)
    post_slots(bed, 3, 1)

    got: list[Completion] = []
    assert until_received(bed, got, 1)
    assert (got[0].wr_id, got[0].qp_num, got[0].status) == (3, bed.qps[0].qpn, WcStatus.SUCCESS)
    assert bytes(bed.mem[3 * SLOT : 3 * SLOT + 4]) == b"late"


def test_the_limit_event_fires_once_below_the_armed_limit_and_disarms() -> None:
    bed = make_bed(9, CLEAN)
    post_slots(bed, 0, 4)
    bed.srq.arm(3)
    assert bed.srq.poll_events() == []  # arming raises nothing by itself (rxe)
    a = bed.senders[0]
    got: list[Completion] = []
    for k in range(3):
        a.qp.post_send(send_wr(k, WrOpcode.SEND, (a.sge(0, 8),)))
        assert until_received(bed, got, k + 1)
        events = bed.srq.poll_events()
        # 4 -> 3 WQEs: not below 3; 3 -> 2: below, once; then disarmed.
        assert events == ([SrqEvent(kind=SrqEventKind.LIMIT_REACHED)] if k == 1 else [])
        assert bed.srq.limit == (3 if k == 0 else 0)
    with pytest.raises(EngineError, match="srq_limit 65"):
        bed.srq.arm(65)


def test_limits_and_refusals() -> None:
    bed = make_bed(11, CLEAN, max_wr=2)
    post_slots(bed, 0, 2)
    with pytest.raises(EngineError) as full:
        post_slots(bed, 2, 1)
    assert full.value.code == "FULL"
    three = tuple(SGE(BASE_ADDR, 1, bed.lkey) for _ in range(3))
    with pytest.raises(EngineError) as sges:
        bed.srq.post_recv(RecvWR(wr_id=9, sg_list=three))
    assert sges.value.code == "INVALID_VALUE"
    with pytest.raises(EngineError) as own:  # rxe_post_recv: -EINVAL on a QP with an SRQ
        bed.qps[0].post_recv(RecvWR(wr_id=9, sg_list=(SGE(BASE_ADDR, 1, bed.lkey),)))
    assert own.value.code == "INVALID_VALUE"
    with pytest.raises(EngineError) as busy:  # ibv_destroy_srq: EBUSY while QPs are attached
        bed.srq.close()
    assert busy.value.code == "IN_USE"
    other = ProtectionDomain(random.Random(1))
    with pytest.raises(EngineError, match="one protection domain"):
        QueuePair(
            other, qpn=0x200, send_cq=CompletionQueue(4), recv_cq=CompletionQueue(4),
            rng=random.Random(1), srq=bed.srq,
        )  # fmt: skip
    for bad in ({"max_wr": 0}, {"max_wr": 8, "max_sge": 0}, {"max_wr": 1 << 20}):
        with pytest.raises(EngineError):
            SharedReceiveQueue(bed.pd, **bad)


def test_a_qp_in_error_flushes_only_its_own_wqe_and_the_srq_serves_the_other() -> None:
    bed = make_bed(13, CLEAN)
    post_slots(bed, 0, 3)
    a0, a1 = bed.senders
    # A two-packet SEND whose first packet takes a WQE; the QP fails before the last arrives.
    a0.qp.post_send(send_wr(1, WrOpcode.SEND, (a0.sge(0, 400),)))
    first, _last = a0.qp.poll_transmit(bed.net.now)
    bed.qps[0].receive(first, bed.net.now)
    assert bed.qps[0].resp.cur_recv is not None
    assert len(bed.srq.rq) == 2
    bed.qps[0].modify(QpState.ERR)
    flushed = bed.rcq.poll(8)
    assert [(c.wr_id, c.status, c.qp_num) for c in flushed] == [(0, WcStatus.WR_FLUSH_ERR, bed.qps[0].qpn)]
    assert bed.srq.poll_events() == [SrqEvent(kind=SrqEventKind.LAST_WQE_REACHED, qpn=bed.qps[0].qpn)]
    assert len(bed.srq.rq) == 2  # the SRQ's other WQEs stay (ibv_modify_qp(3))
    a1.mem[:5] = b"still"
    a1.qp.post_send(send_wr(2, WrOpcode.SEND, (a1.sge(0, 5),)))
    got: list[Completion] = []
    assert until_received(bed, got, 1)
    assert [(c.wr_id, c.status, c.qp_num, c.opcode) for c in got] == [
        (1, WcStatus.SUCCESS, bed.qps[1].qpn, WcOpcode.RECV)
    ]
    assert bytes(bed.mem[SLOT : SLOT + 5]) == b"still"
    bed.qps[0].modify(QpState.RESET)
    assert len(bed.srq.rq) == 1  # RESET drops none of them either
