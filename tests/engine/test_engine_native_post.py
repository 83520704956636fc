"""Native posting (``_fastpath.post_small``) equals the Python engine's ``tx_post``.

A post that makes a fresh one-packet SEND or RDMA WRITE the whole of its requester's work
leaves in the doorbell's call (``UdpPort._post_now`` with ``post_with``; ``SimNet(post=True)``
here). The proofs, on seeded hostile networks (every fault profile, both directions, every
opcode mixed in, so READs, atomics, multi-packet messages and scattered SGEs take the
generic path beside it): the same runs with the native ``post_small`` and with the engine's
own ``tx_post`` at the same moment leave the same trace, memory, completions in order,
counters, requester state (PSNs, WQEs, timers, RTT sample, window, DCQCN, credits),
responder state and virtual time, and the native path took exactly the posts the engine
would have taken.
"""

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest

from rdmakit.engine import SGE, Access, QpCaps, QpState, RecvWR, SendWR, WrOpcode
from rdmakit.testing.engine import both_ways, finished, make_pair, rounds_each_way
from rdmakit.testing.faults import PROFILES, Faults
from rdmakit.transport import fastpath
from rdmakit.transport.codec import SegmentCodec
from tests.engine.qp_state import requester_state, responder_state

pytestmark = pytest.mark.skipif(fastpath.NATIVE is None, reason=f"native data plane: {fastpath.describe()}")

_SEND_WRITE = (WrOpcode.RDMA_WRITE, WrOpcode.SEND, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.SEND_WITH_IMM)


def _on() -> SegmentCodec:
    assert fastpath.NATIVE is not None
    assert fastpath.NATIVE.post_small is not None
    return fastpath.NATIVE


def _off() -> SegmentCodec:
    """The same native codec, posting through the engine's ``tx_post``."""
    codec = copy.copy(_on())
    codec.post_small = codec.post_send = None
    return codec


def _state(p: Any) -> tuple[Any, ...]:
    qa, qb = p.a.qp, p.b.qp
    for q in (qa, qb):
        q.disarm()  # an armed responder's state back to the engine, which is what is compared
    credits = tuple((q.req.credits.ssn, q.req.credits.lsn) for q in (qa, qb))
    return (
        qa.stats, qb.stats, requester_state(qa), requester_state(qb), responder_state(qa),
        responder_state(qb), credits,
    )  # fmt: skip


def _taken(stats: Any) -> tuple[int, int, int]:
    """Posts that left in ``post_send``'s native call, in the doorbell's ``post_small`` and in
    the engine's ``tx_post``."""
    return stats.pop("post_send", 0), stats.pop("post", 0), stats.pop("post_py", 0)


def fingerprint(seed: int, faults: Faults, codec: SegmentCodec, ops: tuple[WrOpcode, ...]) -> tuple[Any, ...]:
    """A bidirectional random workload (all posted at once, MTU 256, up to 300 bytes); the last
    item is how many posts left natively and through ``tx_post``."""
    p = make_pair(seed, faults, mem_size=1 << 14, mtu=256, small=codec, post=True)
    w1, w2 = both_ways(p, random.Random(seed ^ 0x5A11), 14, 300, 1 << 13, ops)
    assert p.net.run(until=lambda: finished(p, w1, w2), max_time=600.0), f"seed={seed}"
    p.net.run(max_time=p.net.now + 1.0)  # the last ACKs and duplicates settle
    p.drain()
    w1.check()
    w2.check()
    taken = _taken(p.net.stats)
    run = (p.net.now, bytes(p.a.mem), bytes(p.b.mem), p.a.sent, p.a.received, p.b.sent, p.b.received)
    return run, _state(p), (p.net.trace_digest(), dict(p.net.stats)), taken


def latency_bound(seed: int, faults: Faults, codec: SegmentCodec, post: bool = True) -> tuple[Any, ...]:
    """30 rounds of one SEND or WRITE (with or without immediate) each way, each round waited
    for; the last item as in ``fingerprint``."""
    p = make_pair(seed, faults, mem_size=1 << 16, mtu=256, small=codec, post=post)
    rng = random.Random(seed)
    p.a.mem[:] = rng.randbytes(len(p.a.mem))
    p.b.mem[:] = rng.randbytes(len(p.b.mem))
    done = rounds_each_way(p, rng, seed, 30, _SEND_WRITE, 200, 1024)
    taken = _taken(p.net.stats)
    run = (p.net.now, bytes(p.a.mem), bytes(p.b.mem), tuple(done))
    return run, _state(p), (p.net.trace_digest(), dict(p.net.stats)), taken


@pytest.mark.parametrize("name", PROFILES)
def test_native_posting_equals_the_engine(name: str) -> None:
    """Every fault profile, both directions, SEND/WRITE only and every opcode mixed: identical
    runs posting natively and through the engine, the same posts taken."""
    faults = PROFILES[name]
    took = whole = 0
    for seed in range(4):
        for ops in (_SEND_WRITE, tuple(WrOpcode)):
            off = fingerprint(seed, faults, _off(), ops)
            on = fingerprint(seed, faults, _on(), ops)
            assert on[:3] == off[:3], f"seed={seed} faults={name} ops={len(ops)}"
            assert off[3][:2] == (0, 0), off[3]
            assert on[3][2] == 0, on[3]
            assert sum(on[3]) == off[3][2], (on[3], off[3])
            took += on[3][0] + on[3][1]
            whole += on[3][0]
    print(f"{name}: {took} posts left natively, {whole} in post_send's one call")
    assert took > 4, took
    assert whole > 0, whole


@pytest.mark.parametrize("name", ["clean", "loss1", "reorder10"])
def test_latency_bound_posts_leave_natively(name: str) -> None:
    """One SEND or WRITE each way per round: most posts are the requester's whole work and leave
    natively (the rest are the engine's to hold: a credit limit, responder output queued); the
    runs equal the engine's."""
    eligible = took = whole = 0
    for seed in range(3):
        off = latency_bound(seed, PROFILES[name], _off())
        on = latency_bound(seed, PROFILES[name], _on())
        assert on[:3] == off[:3], f"seed={seed} faults={name}"
        assert off[3][:2] == (0, 0), off[3]
        assert on[3][2] == 0, on[3]
        assert sum(on[3]) == off[3][2], (on[3], off[3])
        eligible += 60
        took += on[3][0] + on[3][1]
        whole += on[3][0]
    print(f"{name}: {took} of {eligible} SEND/WRITE posts left natively, {whole} in post_send's one call")
    assert took >= 0.8 * eligible, (took, eligible)
    assert whole >= 0.7 * eligible, (whole, eligible)


def test_posting_at_once_or_at_the_pump_does_the_same_work() -> None:
    """Posting at once (natively) or at the next pump (no doorbell) changes when packets leave,
    not what the work does: the same memory and completions on a clean network."""
    for seed in range(3):
        now = latency_bound(seed, PROFILES["clean"], _on())
        pump = latency_bound(seed, PROFILES["clean"], _on(), post=False)
        assert now[0][1:] == pump[0][1:], f"seed={seed}"
        assert pump[3] == (0, 0, 0)


def _wqes(qp: Any) -> tuple[Any, ...]:
    """Every field of every send WQE, with its type (a WQE native ``post_send`` made must be
    the one ``SendWqe.__init__`` makes); views as their bytes."""

    def val(x: Any) -> Any:
        if isinstance(x, memoryview):
            return ("view", bytes(x))
        if isinstance(x, list):
            return tuple(val(v) for v in x)
        return (type(x).__name__, x)

    return tuple(tuple((n, val(getattr(w, n))) for n in type(w).__slots__) for w in qp.req.sq)


_READ_ONLY = 0x77000  # a region without LOCAL_WRITE: a READ may not land in it, a WRITE may leave it


def _hostile(p: Any) -> list[tuple[str, Callable[[], SendWR], Callable[[], None]]]:
    """(name, the work request, what is done to the QP first): each is refused, failed or
    queued by the engine's own rules; posted after one good WRITE has gone both ways."""
    a, qa = p.a, p.a.qp
    mr = a.mr
    good: dict[str, Any] = {
        "wr_id": 7, "opcode": WrOpcode.RDMA_WRITE, "sg_list": (a.sge(0, 8),), "remote_addr": p.b.mr.addr,
        "rkey": p.b.mr.rkey,
    }  # fmt: skip
    ro = [m.lkey for m in a.pd if m.addr == _READ_ONLY] or [0]
    nothing: Callable[[], None] = lambda: None  # noqa: E731

    def wr(**kw: Any) -> Callable[[], SendWR]:
        return lambda: SendWR(**{**good, **kw})

    def fill() -> None:
        while len(qa.req.sq) < qa.caps.max_send_wr:
            qa.post_send(SendWR(**good))

    def no_credit() -> None:
        qa.post_send(SendWR(**good))  # outstanding: the SEND is no idle probe
        qa.req.credits.lsn = (qa.req.credits.ssn - 1) & 0xFFFFFF  # the limit, and its probe, spent

    def state(st: QpState) -> Callable[[], None]:
        return lambda: qa.enter_error() if st is QpState.ERR else qa.modify(st)

    return [
        ("good", wr(), nothing),
        ("good SEND solicited unsignaled", wr(opcode=WrOpcode.SEND, solicited=1, signaled=0), nothing),
        ("good WRITE solicited", wr(solicited=True), nothing),
        ("good WRITE with imm", wr(opcode=WrOpcode.RDMA_WRITE_WITH_IMM, imm_data=0xFFFFFFFF), nothing),
        ("empty SEND", wr(opcode=WrOpcode.SEND, sg_list=(), solicited=True), nothing),
        ("int opcode", wr(opcode=2), nothing),
        ("bad lkey", wr(sg_list=(SGE(mr.addr, 8, mr.lkey ^ 1),)), nothing),
        ("unhashable lkey", wr(sg_list=(SGE(mr.addr, 8, [1]),)), nothing),  # type: ignore[arg-type]
        ("past the region", wr(sg_list=(SGE(mr.addr + mr.length - 4, 8, mr.lkey),)), nothing),
        ("before the region", wr(sg_list=(SGE(mr.addr - 1, 8, mr.lkey),)), nothing),
        ("negative address", wr(sg_list=(SGE(-8, 8, mr.lkey),)), nothing),
        ("negative length", wr(sg_list=(SGE(mr.addr, -8, mr.lkey),)), nothing),
        ("too many SGEs", wr(sg_list=(a.sge(0, 1),) * (qa.caps.max_send_sge + 1)), nothing),
        ("two regions", wr(sg_list=(a.sge(0, 4), a.sge(8, 4))), nothing),
        ("a list of SGEs", wr(sg_list=[a.sge(0, 8)]), nothing),
        ("a plain tuple SGE", wr(sg_list=((mr.addr, 8, mr.lkey),)), nothing),
        ("over the MTU", wr(sg_list=(a.sge(0, 300),)), nothing),
        ("over 2**31", wr(sg_list=(SGE(mr.addr, 1 << 31, mr.lkey), SGE(mr.addr, 1, mr.lkey))), nothing),
        ("no imm", wr(opcode=WrOpcode.SEND_WITH_IMM), nothing),
        ("imm too big", wr(opcode=WrOpcode.SEND_WITH_IMM, imm_data=1 << 32), nothing),
        ("remote_addr -1", wr(remote_addr=-1), nothing),
        ("remote_addr 2**64", wr(remote_addr=1 << 64), nothing),
        ("rkey 2**32", wr(rkey=1 << 32), nothing),
        ("unknown opcode", wr(opcode=99), nothing),
        (
            "READ into a read-only region",
            wr(opcode=WrOpcode.RDMA_READ, sg_list=(SGE(_READ_ONLY, 8, ro[0]),)),
            nothing,
        ),
        ("WRITE from a read-only region", wr(sg_list=(SGE(_READ_ONLY, 8, ro[0]),)), nothing),
        ("full send queue", wr(), fill),
        ("SEND past the credits", wr(opcode=WrOpcode.SEND), no_credit),
        ("SQD", wr(), state(QpState.SQD)),
        ("ERR", wr(), state(QpState.ERR)),
    ]


def _hostile_run(codec: SegmentCodec, case: int) -> tuple[Any, ...]:
    caps = QpCaps(max_send_wr=6)
    p = make_pair(11, PROFILES["clean"], mem_size=1 << 12, mtu=256, small=codec, post=True, caps=caps)
    p.a.pd.register(bytearray(64), _READ_ONLY, Access.NONE)
    for i in range(4):
        p.b.qp.post_recv(RecvWR(wr_id=i, sg_list=(p.b.sge(2048, 512),)))
    first = SendWR(
        wr_id=1,
        opcode=WrOpcode.RDMA_WRITE,
        sg_list=(p.a.sge(0, 8),),
        remote_addr=p.b.mr.addr,
        rkey=p.b.mr.rkey,
    )
    p.a.qp.post_send(first)
    assert p.net.run(until=lambda: len(p.a.scq) > 0, max_time=10.0)
    name, make, before = _hostile(p)[case]
    before()
    _taken(p.net.stats)  # what the set-up posted
    try:
        p.a.qp.post_send(make())
        raised = None
    except Exception as e:  # whatever the engine raises, compared
        raised = (type(e).__name__, str(e))
    fresh = _wqes(p.a.qp), requester_state(p.a.qp), (p.a.qp.req.credits.ssn, p.a.qp.req.credits.lsn)
    p.net.run(max_time=p.net.now + 0.1)
    p.drain()
    taken = _taken(p.net.stats)
    run = (raised, fresh, p.net.now, bytes(p.a.mem), bytes(p.b.mem), p.a.sent, p.a.received, p.b.received)
    return name, run, _state(p), (p.net.trace_digest(), dict(p.net.stats)), taken


def test_hostile_work_requests_fare_as_the_engine_makes_them_fare() -> None:
    """Every check of ``post_send`` (state, opcode, SGE count and lengths, L_Key, range,
    access, ImmDt, remote address and R_Key, a full queue): native ``post_send`` raises,
    fails or queues exactly as the engine does (it declines and the engine's own code runs),
    and the good ones it takes make the same WQE, packets and state."""
    took = 0
    for case in range(len(_hostile(make_pair(11, mtu=256)))):
        on, off = _hostile_run(_on(), case), _hostile_run(_off(), case)
        assert on[:4] == off[:4], on[0]
        took += on[4][0]
        if on[0].startswith("good") or on[0] in ("empty SEND", "int opcode", "WRITE from a read-only region"):
            assert on[4][0] == 1, on  # taken in post_send's one call
        else:
            assert on[4][0] == 0, on
    assert took == 7
