"""Hypothesis: random and mutated packets into live QPs.

The invariant (h11's fuzz rule, applied to a protocol engine): ``receive``
never raises whatever the packet; afterwards the QP is in a legal state
(RTS, or ERR after a class A/C error), its timers and transmit path still
work, every send WR still completes (with some status) once the real peer is
reconnected, and a fresh pair still transfers data.
"""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmakit.engine import QpState, WcStatus, WrOpcode
from rdmakit.testing.engine import Captured, Pair, fill, make_pair, pump, recv_wr, send_wr
from rdmakit.wire import AETH, OPCODE_INFO, RETH, AtomicETH, Opcode, Packet, WireError, decode, encode

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
U32 = st.integers(0, (1 << 32) - 1)
U64 = st.integers(0, (1 << 64) - 1)


@st.composite
def packets(draw: st.DrawFn, p: Pair, to_b: bool, psn_base: int) -> Packet:
    dst = p.b if to_b else p.a
    mr = dst.mr if to_b else p.b.mr
    op = draw(st.sampled_from(sorted(OPCODE_INFO)))
    info = OPCODE_INFO[op]
    psn = (psn_base + draw(st.just(0) | st.integers(-4, 14))) & 0xFFFFFF
    key = draw(st.sampled_from([mr.rkey, mr.rkey ^ 1, mr.lkey])) if draw(st.booleans()) else draw(U32)
    va = mr.addr + draw(st.integers(-16, mr.length + 16)) if draw(st.booleans()) else draw(U64)
    reth = RETH(
        va, key, draw(st.integers(0, 3000) | st.sampled_from([1 << 31, (1 << 31) + 1, (1 << 32) - 1]))
    )
    syndrome = draw(
        st.sampled_from([0x1F, 0x00, 0x21, 0x3F, 0x60, 0x61, 0x62, 0x63, 0x64, 0x40, 0xFF])
        | st.integers(0, 255)
    )
    pkt = Packet(
        Opcode(op),
        dst.qp.qpn if draw(st.integers(0, 9)) else draw(st.integers(0, 0xFFFFFF)),
        psn,
        draw(st.booleans()),
        pkey=0xFFFF if draw(st.integers(0, 9)) else draw(st.integers(0, 0xFFFF)),
        reth=reth if info.reth else None,
        aeth=AETH(syndrome, draw(st.integers(0, 0xFFFFFF))) if info.aeth else None,
        atomic_eth=AtomicETH(va, key, draw(U64), draw(U64)) if info.atomic_eth else None,
        atomic_ack=draw(U64) if info.atomic_ack_eth else None,
        imm=draw(U32) if info.imm else None,
        ieth=draw(U32) if info.ieth else None,
        payload=draw(st.binary(max_size=1100)) if info.payload else b"",
    )
    if draw(st.integers(0, 19)) == 0:  # a header combination the opcode doesn't allow
        field = draw(st.sampled_from(["reth", "aeth", "atomic_eth", "atomic_ack", "imm", "payload"]))
        pkt = Packet(**{**pkt._asdict(), field: None if field != "payload" else b"junk"})
    return pkt


def legal(state: QpState) -> bool:
    return state in (QpState.RTS, QpState.ERR)


def live_pair(seed: int) -> Pair:
    p = make_pair(seed, mtu=1024, retry_cnt=3, rnr_retry=3, timeout=6, max_rd_atomic=4)
    fill(p.a.mem, random.Random(seed))
    fill(p.b.mem, random.Random(seed + 1))
    for i in range(4):
        p.b.qp.post_recv(recv_wr(100 + i, (p.b.sge(i * 4096, 4096),)))
    return p


def post_mixed(p: Pair) -> int:
    a, b = p.a, p.b
    wrs = [
        send_wr(1, WrOpcode.SEND, (a.sge(0, 2500),)),
        send_wr(2, WrOpcode.RDMA_WRITE, (a.sge(0, 3000),), remote_addr=b.mr.addr + 20000, rkey=b.mr.rkey),
        send_wr(3, WrOpcode.RDMA_READ, (a.sge(30000, 2100),), remote_addr=b.mr.addr + 40000, rkey=b.mr.rkey),
        send_wr(4, WrOpcode.ATOMIC_FETCH_AND_ADD, (a.sge(50000, 8),), remote_addr=b.mr.addr, rkey=b.mr.rkey),
        send_wr(5, WrOpcode.SEND_WITH_IMM, (a.sge(0, 10),), imm_data=7),
    ]
    for wr in wrs:
        a.qp.post_send(wr)
    return len(wrs)


def still_works(seed: int) -> None:
    p = make_pair(seed + 10_000)
    fill(p.a.mem, random.Random(seed))
    p.b.qp.post_recv(recv_wr(1, (p.b.sge(0, 3000),)))
    p.a.qp.post_send(send_wr(1, WrOpcode.SEND, (p.a.sge(100, 3000),)))
    assert p.run_until_completions(1, 1)
    assert p.a.sent[0].status is WcStatus.SUCCESS
    assert p.b.mem[:3000] == p.a.mem[100:3100]


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 1 << 16))
def test_random_requests_into_a_live_responder(data: st.DataObject, seed: int) -> None:
    p = live_pair(seed)
    b = p.b.qp
    base = b.attrs.rq_psn or 0
    # Sometimes start from a realistic state: a message half received.
    if data.draw(st.booleans()):
        p.a.qp.post_send(send_wr(9, WrOpcode.SEND, (p.a.sge(0, 3000),)))
        first = p.a.qp.poll_transmit(0.0, max_packets=1)
        b.receive(first[0], 0.0)
        base += 1
    for pkt in data.draw(st.lists(packets(p, True, base), min_size=1, max_size=25)):
        b.receive(pkt, 0.0)
        b.poll_transmit(0.0, max_packets=data.draw(st.sampled_from([None, 1, 3])))
        assert legal(b.state)
    b.poll_transmit(0.0)
    b.handle_timer(1e9)
    assert legal(b.state)
    p.drain()
    assert all(isinstance(c.status, WcStatus) for c in p.b.received)
    if b.state is QpState.ERR:
        assert all(c.status is not WcStatus.SUCCESS for c in p.b.received[-1:])
    still_works(seed)


@SETTINGS
@given(data=st.data(), seed=st.integers(0, 1 << 16))
def test_random_responses_into_a_live_requester(data: st.DataObject, seed: int) -> None:
    p = live_pair(seed)
    a = p.a.qp
    n = post_mixed(p)
    sent = a.poll_transmit(0.0)
    # Deliver a prefix of the real exchange so responses are expected mid-flight.
    for pkt in sent[: data.draw(st.integers(0, len(sent)))]:
        p.b.qp.receive(pkt, 0.0)
    base = (sent[0].psn + data.draw(st.integers(0, 10))) & 0xFFFFFF
    for pkt in data.draw(st.lists(packets(p, False, base), min_size=1, max_size=25)):
        a.receive(pkt, 0.0)
        assert legal(a.state)
        a.poll_transmit(0.0, max_packets=data.draw(st.sampled_from([None, 2])))
    a.handle_timer(1e9)
    assert legal(a.state)
    # Liveness: with the real peer, every send WR completes, one way or another.
    assert p.run_until_completions(n, max_time=60.0)
    p.drain()
    assert sorted(c.wr_id for c in p.a.sent) == list(range(1, n + 1))
    assert [c.wr_id for c in p.a.sent] == list(range(1, n + 1))  # in posting order


def exchange(seed: int) -> tuple[list[bytes], list[bytes]]:
    """The packets of a normal transfer, encoded: (a -> b, b -> a)."""
    p = live_pair(seed)
    post_mixed(p)
    cap: Captured = []
    pump(p.a.qp, p.b.qp, capture=cap)
    to_b = [encode(x) for src, x in cap if src is p.a.qp]
    to_a = [encode(x) for src, x in cap if src is p.b.qp]
    return to_b, to_a


EXCHANGE = exchange(1)


@st.composite
def mutated(draw: st.DrawFn, datagrams: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(datagrams)))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "byte", "truncate", "extend", "splice"]))
        if how == "flip" and data:
            i = draw(st.integers(0, len(data) * 8 - 1))
            data[i >> 3] ^= 1 << (i & 7)
        elif how == "byte" and data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif how == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif how == "extend":
            data += draw(st.binary(max_size=64))
        else:
            other = draw(st.sampled_from(datagrams))
            cut = draw(st.integers(0, min(len(data), len(other))))
            data = data[:cut] + other[cut:]
    return bytes(data)


@SETTINGS
@given(data=st.data())
def test_mutated_packets_of_a_real_exchange(data: st.DataObject) -> None:
    to_b, to_a = EXCHANGE
    p = live_pair(1)  # the same start as EXCHANGE: PSNs, keys and addresses match
    post_mixed(p)
    p.a.qp.poll_transmit(0.0)
    for _ in range(data.draw(st.integers(1, 20))):
        toward_b = data.draw(st.booleans())
        raw = data.draw(mutated(to_b if toward_b else to_a))
        try:
            pkt = decode(raw)
        except WireError:
            continue
        qp = p.b.qp if toward_b else p.a.qp
        qp.receive(pkt, 0.0)
        qp.poll_transmit(0.0)
        assert legal(qp.state)
    pump(p.a.qp, p.b.qp)
    assert legal(p.a.qp.state)
    assert legal(p.b.qp.state)
