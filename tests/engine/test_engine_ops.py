"""Every RC operation end to end, and the requester's packet-level rules."""

import random
from typing import Unpack

import pytest

from rdmakit.engine import SGE, Access, EngineError, QpCaps, WcOpcode, WcStatus, WrOpcode
from rdmakit.testing.engine import (
    Captured,
    Pair,
    PairOptions,
    Workload,
    fill,
    make_pair,
    pump,
    recv_wr,
    send_wr,
)
from rdmakit.testing.faults import Faults
from rdmakit.wire import Opcode, Packet

MTU = 1024
SIZES = [0, 1, MTU - 1, MTU, MTU + 1, 3 * MTU + 17]
DATA_OPS = [
    WrOpcode.SEND,
    WrOpcode.SEND_WITH_IMM,
    WrOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM,
    WrOpcode.RDMA_READ,
]


def run_one(
    p: Pair, op: WrOpcode, size: int, *, imm: int | None = 0x12345678, soff: int = 0, doff: int = 4096
) -> None:
    a, b = p.a, p.b
    kw: dict[str, object] = {}
    if op in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM):
        kw["imm_data"] = imm
    if op not in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM):
        kw.update(remote_addr=b.mr.addr + doff, rkey=b.mr.rkey)
    n_recv = 0
    if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM):
        b.qp.post_recv(
            recv_wr(77, (b.sge(doff, size + 5),) if op is not WrOpcode.RDMA_WRITE_WITH_IMM else ())
        )
        n_recv = 1
    a.qp.post_send(send_wr(1, op, (a.sge(soff, size),), **kw))
    assert p.run_until_completions(1, n_recv)
    (wc,) = a.sent
    assert wc.status is WcStatus.SUCCESS
    assert wc.wr_id == 1
    assert wc.byte_len == size
    assert wc.qp_num == a.qp.qpn
    if op is WrOpcode.RDMA_READ:
        assert wc.opcode is WcOpcode.RDMA_READ
        assert a.mem[soff : soff + size] == b.mem[doff : doff + size]
    else:
        assert b.mem[doff : doff + size] == a.mem[soff : soff + size]
    if n_recv:
        (rc,) = b.received
        assert rc.status is WcStatus.SUCCESS
        assert rc.wr_id == 77
        assert rc.byte_len == size
        assert rc.opcode is (
            WcOpcode.RECV_RDMA_WITH_IMM if op is WrOpcode.RDMA_WRITE_WITH_IMM else WcOpcode.RECV
        )
        assert rc.imm_data == kw.get("imm_data")
        assert rc.qp_num == b.qp.qpn
        assert rc.src_qp == a.qp.qpn
    else:
        assert not b.received


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("op", DATA_OPS, ids=lambda o: o.name)
def test_data_ops(op: WrOpcode, size: int) -> None:
    p = make_pair(size * 7 + op, mtu=MTU)
    rng = random.Random(size)
    fill(p.a.mem, rng)
    fill(p.b.mem, rng)
    run_one(p, op, size)
    assert p.a.qp.stats.retransmits == 0
    assert not p.a.qp.stats.dropped
    assert not p.b.qp.stats.dropped


@pytest.mark.parametrize("op", DATA_OPS, ids=lambda o: o.name)
def test_four_mib_once(op: WrOpcode) -> None:
    size = 4 << 20
    p = make_pair(op, Faults(loss=0.001), mtu=4096, mem_size=2 * size + 8192)
    fill(p.a.mem, random.Random(1))
    fill(p.b.mem, random.Random(2))
    run_one(p, op, size, doff=size + 4096)


def test_imm_data_is_the_wire_u32() -> None:
    p = make_pair(3)
    run_one(p, WrOpcode.SEND_WITH_IMM, 4, imm=0xFFFFFFFF)


def atomic(p: Pair, op: WrOpcode, target: int, compare_add: int, swap: int = 0) -> tuple[int, int]:
    """Run one atomic on b's u64 holding ``target``; (original value seen by a, value now in b)."""
    a, b = p.a, p.b
    b.mem[64:72] = target.to_bytes(8, "little")
    a.mem[0:8] = bytes(8)
    a.qp.post_send(
        send_wr(
            9,
            op,
            (a.sge(0, 8),),
            remote_addr=b.mr.addr + 64,
            rkey=b.mr.rkey,
            compare_add=compare_add,
            swap=swap,
        )
    )
    assert p.run_until_completions(len(a.sent) + 1)
    wc = a.sent[-1]
    assert wc.status is WcStatus.SUCCESS
    assert wc.byte_len == 8
    assert wc.opcode is (WcOpcode.COMP_SWAP if op is WrOpcode.ATOMIC_CMP_AND_SWP else WcOpcode.FETCH_ADD)
    return int.from_bytes(a.mem[0:8], "little"), int.from_bytes(b.mem[64:72], "little")


def test_compare_and_swap_hit_and_miss() -> None:
    p = make_pair(4)
    assert atomic(p, WrOpcode.ATOMIC_CMP_AND_SWP, 5, compare_add=5, swap=9) == (5, 9)
    assert atomic(p, WrOpcode.ATOMIC_CMP_AND_SWP, 5, compare_add=6, swap=9) == (5, 5)
    top = (1 << 64) - 1
    assert atomic(p, WrOpcode.ATOMIC_CMP_AND_SWP, top, compare_add=top, swap=1 << 63) == (top, 1 << 63)


def test_fetch_and_add_wraps_at_64_bits() -> None:
    p = make_pair(5)
    assert atomic(p, WrOpcode.ATOMIC_FETCH_AND_ADD, 40, compare_add=2) == (40, 42)
    assert atomic(p, WrOpcode.ATOMIC_FETCH_AND_ADD, (1 << 64) - 1, compare_add=2) == ((1 << 64) - 1, 1)


def test_atomics_in_host_byte_order() -> None:
    import sys

    p = make_pair(6)
    orig, new = atomic(p, WrOpcode.ATOMIC_FETCH_AND_ADD, 0x0102, compare_add=1)
    assert (orig, new) == (0x0102, 0x0103)
    assert p.b.mem[64:72] == (0x0103).to_bytes(8, sys.byteorder)
    assert p.a.mem[0:8] == (0x0102).to_bytes(8, sys.byteorder)


def test_sixty_four_outstanding_in_order() -> None:
    p = make_pair(7, Faults(loss=0.02, reorder=0.1), mtu=256, mem_size=1 << 17, caps=QpCaps(max_send_wr=64))
    rng = random.Random(7)
    fill(p.a.mem, rng)
    fill(p.b.mem, rng)
    w = Workload(p.a, p.b, rng, 64, 700, 0, 1 << 16)
    w.post()
    with pytest.raises(EngineError) as e:
        p.a.qp.post_send(send_wr(999, WrOpcode.SEND, ()))
    assert e.value.code == "FULL"
    assert p.run_until_completions(w.n_signaled, len(w.expect_recv))
    w.check()


def test_scatter_gather_lists() -> None:
    p = make_pair(8, mtu=256)
    a, b = p.a, p.b
    fill(a.mem, random.Random(8))
    b.qp.post_recv(recv_wr(1, (b.sge(1000, 100), b.sge(5000, 300), b.sge(9000, 50))))
    a.qp.post_send(send_wr(1, WrOpcode.SEND, (a.sge(0, 7), a.sge(300, 250), a.sge(2000, 143))))
    assert p.run_until_completions(1, 1)
    msg = bytes(a.mem[0:7] + a.mem[300:550] + a.mem[2000:2143])
    assert bytes(b.mem[1000:1100] + b.mem[5000:5300]) == msg
    assert b.received[0].byte_len == 400
    b.mem[7000:7400] = random.Random(9).randbytes(400)
    a.qp.post_send(
        send_wr(
            2,
            WrOpcode.RDMA_READ,
            (a.sge(100, 3), a.sge(3000, 397)),
            remote_addr=b.mr.addr + 7000,
            rkey=b.mr.rkey,
        )
    )
    assert p.run_until_completions(2)
    assert bytes(a.mem[100:103] + a.mem[3000:3397]) == bytes(b.mem[7000:7400])


def test_unsignaled_complete_silently() -> None:
    p = make_pair(9)
    a, b = p.a, p.b
    for i in range(5):
        a.qp.post_send(
            send_wr(
                i,
                WrOpcode.RDMA_WRITE,
                (a.sge(0, 10),),
                remote_addr=b.mr.addr,
                rkey=b.mr.rkey,
                signaled=i == 4,
            )
        )
    assert p.run_until_completions(1)
    p.net.run(max_time=1)
    p.drain()
    assert [c.wr_id for c in a.sent] == [4]


# -- packet-level rules (IBTA §9.7.1, rxe_req.c) --


def direct(seed: int = 1, **conn: Unpack[PairOptions]) -> Pair:
    p = make_pair(seed, **conn)
    fill(p.a.mem, random.Random(seed))
    return p


def data_packets(cap: Captured, p: Pair) -> list[Packet]:
    return [pkt for src, pkt in cap if src is p.a.qp]


def test_segmentation_and_psns() -> None:
    p = direct(mtu=256)
    a, b = p.a, p.b
    cap: Captured = []
    a.qp.post_send(
        send_wr(1, WrOpcode.RDMA_WRITE, (a.sge(0, 3 * 256 + 5),), remote_addr=b.mr.addr, rkey=b.mr.rkey)
    )
    a.qp.post_send(send_wr(2, WrOpcode.SEND, (a.sge(0, 0),)))
    b.qp.post_recv(recv_wr(1, ()))
    pump(a.qp, b.qp, capture=cap)
    pkts = data_packets(cap, p)
    ops = [x.opcode for x in pkts]
    assert ops == [
        Opcode.RDMA_WRITE_FIRST,
        Opcode.RDMA_WRITE_MIDDLE,
        Opcode.RDMA_WRITE_MIDDLE,
        Opcode.RDMA_WRITE_LAST,
        Opcode.SEND_ONLY,
    ]
    assert [len(x.payload) for x in pkts] == [256, 256, 256, 5, 0]
    assert all(isinstance(x.payload, memoryview) for x in pkts[:4])
    assert pkts[0].reth is not None
    assert pkts[0].reth.dma_len == 3 * 256 + 5
    assert all(x.reth is None for x in pkts[1:])
    psn0 = pkts[0].psn
    assert [x.psn for x in pkts] == [(psn0 + i) & 0xFFFFFF for i in range(5)]
    assert [x.ackreq for x in pkts] == [False, False, False, True, True]
    assert all(x.dest_qp == b.qp.qpn for x in pkts)
    assert [c.wr_id for c in a.scq.poll(9)] == [1, 2]


def test_payloads_are_zero_copy_views_of_registered_memory() -> None:
    p = direct()
    a, b = p.a, p.b
    a.qp.post_send(send_wr(1, WrOpcode.RDMA_WRITE, (a.sge(100, 10),), remote_addr=b.mr.addr, rkey=b.mr.rkey))
    (pkt,) = a.qp.poll_transmit(0.0)
    assert isinstance(pkt.payload, memoryview)
    a.mem[100] ^= 0xFF
    assert pkt.payload[0] == a.mem[100]


def test_ackreq_rule_of_rxe() -> None:
    # rxe init_req_packet(): ack_req = END || noack_pkts++ > RXE_MAX_PKT_PER_ACK (64).
    p = direct(mtu=256)
    a, b = p.a, p.b
    p.a.qp.window = 1000
    n = 200
    a.qp.post_send(
        send_wr(1, WrOpcode.RDMA_WRITE, (a.sge(0, n * 256),), remote_addr=b.mr.addr, rkey=b.mr.rkey)
    )
    pkts = a.qp.poll_transmit(0.0)
    assert len(pkts) == n
    assert [i for i, x in enumerate(pkts) if x.ackreq] == [65, 131, 197, 199]


def test_window_of_unacked_psns() -> None:
    p = direct(mtu=256, mem_size=1 << 17)
    a, b = p.a, p.b
    a.qp.post_send(
        send_wr(1, WrOpcode.RDMA_WRITE, (a.sge(0, 300 * 256),), remote_addr=b.mr.addr, rkey=b.mr.rkey)
    )
    first = a.qp.poll_transmit(0.0)
    assert len(first) == 128
    assert a.qp.poll_transmit(0.0) == []
    for pkt in first[:70]:  # up to the AckReq at index 65
        b.qp.receive(pkt, 0.0)
    (ack,) = b.qp.poll_transmit(0.0)
    assert ack.opcode is Opcode.ACKNOWLEDGE
    assert ack.psn == first[65].psn
    a.qp.receive(ack, 0.0)
    more = a.qp.poll_transmit(0.0)
    assert len(more) == 66  # 128 unacked again
    assert more[0].psn == (first[-1].psn + 1) & 0xFFFFFF


def test_read_consumes_psns_and_max_rd_atomic_limits_outstanding() -> None:
    p = direct(mtu=256, max_rd_atomic=2)
    a, b = p.a, p.b
    for i, size in enumerate((1000, 0, 300, 8)):
        a.qp.post_send(
            send_wr(i, WrOpcode.RDMA_READ, (a.sge(i * 1024, size),), remote_addr=b.mr.addr, rkey=b.mr.rkey)
        )
    reqs = a.qp.poll_transmit(0.0)
    assert [x.opcode for x in reqs] == [Opcode.RDMA_READ_REQUEST] * 2  # max_rd_atomic = 2
    assert reqs[1].psn == (reqs[0].psn + 4) & 0xFFFFFF  # ceil(1000 / 256) = 4 PSNs
    assert [x.reth.dma_len for x in reqs if x.reth] == [1000, 0]
    cap: Captured = []
    pump(a.qp, b.qp, capture=[])
    for pkt in reqs:
        b.qp.receive(pkt, 0.0)
    pump(a.qp, b.qp, capture=cap)
    later = [x for src, x in cap if src is a.qp]
    assert later[0].psn == (reqs[1].psn + 1) & 0xFFFFFF  # a zero-length READ takes one PSN
    assert later[1].psn == (later[0].psn + 2) & 0xFFFFFF  # 300 bytes: 2 PSNs
    assert [c.wr_id for c in a.scq.poll(9)] == [0, 1, 2, 3]


def test_read_responses_segmented_by_mtu() -> None:
    p = direct(mtu=256)
    a, b = p.a, p.b
    cap: Captured = []
    a.qp.post_send(send_wr(1, WrOpcode.RDMA_READ, (a.sge(0, 600),), remote_addr=b.mr.addr, rkey=b.mr.rkey))
    a.qp.post_send(send_wr(2, WrOpcode.RDMA_READ, (a.sge(0, 0),), remote_addr=0, rkey=0))
    pump(a.qp, b.qp, capture=cap)
    resp = [x for src, x in cap if src is b.qp]
    assert [x.opcode for x in resp] == [
        Opcode.RDMA_READ_RESPONSE_FIRST, Opcode.RDMA_READ_RESPONSE_MIDDLE, Opcode.RDMA_READ_RESPONSE_LAST,
        Opcode.RDMA_READ_RESPONSE_ONLY,
    ]  # fmt: skip
    assert [len(x.payload) for x in resp] == [256, 256, 88, 0]
    assert [x.aeth is None for x in resp] == [False, True, False, False]
    assert resp[0].aeth is not None
    assert resp[2].aeth is not None
    assert resp[2].aeth.msn == resp[0].aeth.msn


def test_msn_counts_messages() -> None:
    p = direct(mtu=256)
    a, b = p.a, p.b
    cap: Captured = []
    for i in range(3):
        a.qp.post_send(
            send_wr(i, WrOpcode.RDMA_WRITE, (a.sge(0, 600),), remote_addr=b.mr.addr, rkey=b.mr.rkey)
        )
        pump(a.qp, b.qp, capture=cap)
    acks = [x for src, x in cap if src is b.qp]
    assert [x.aeth.msn for x in acks if x.aeth] == [1, 2, 3]


def test_one_cq_for_send_and_receive() -> None:
    from rdmakit.engine import CompletionQueue, ProtectionDomain, QueuePair
    from rdmakit.testing.engine import connect

    rng = random.Random(10)
    sides = []
    for _ in range(2):
        pd = ProtectionDomain(rng)
        mem = bytearray(4096)
        mr = pd.register(mem, 0x1000, Access.LOCAL_WRITE)
        cq = CompletionQueue(16)
        sides.append(
            (QueuePair(pd, qpn=rng.randrange(2, 1 << 24), send_cq=cq, recv_cq=cq, rng=rng), cq, mr, mem)
        )
    (qa, cqa, mra, mema), (qb, cqb, mrb, memb) = sides
    connect(qa, qb, rng)
    qb.post_recv(recv_wr(7, (SGE(0x1000, 100, mrb.lkey),)))
    qa.post_recv(recv_wr(8, (SGE(0x1000, 100, mra.lkey),)))
    mema[:5] = b"hello"
    memb[200:205] = b"world"
    qa.post_send(send_wr(1, WrOpcode.SEND, (SGE(0x1000, 5, mra.lkey),)))
    qb.post_send(send_wr(2, WrOpcode.SEND, (SGE(0x1000 + 200, 5, mrb.lkey),)))
    pump(qa, qb)
    assert sorted((c.wr_id, c.opcode) for c in cqa.poll(9)) == [(1, WcOpcode.SEND), (8, WcOpcode.RECV)]
    assert sorted((c.wr_id, c.opcode) for c in cqb.poll(9)) == [(2, WcOpcode.SEND), (7, WcOpcode.RECV)]
    assert memb[:5] == b"hello"
    assert mema[:5] == b"world"
