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
from typing import Any

import pytest

from rdmakit.engine import WrOpcode
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
    codec.post_small = None
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
    taken = (p.net.stats.pop("post", 0), p.net.stats.pop("post_py", 0))
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
    taken = (p.net.stats.pop("post", 0), p.net.stats.pop("post_py", 0))
    run = (p.net.now, bytes(p.a.mem), bytes(p.b.mem), tuple(done))
    return run, _state(p), (p.net.trace_digest(), dict(p.net.stats)), taken


@pytest.mark.parametrize("name", PROFILES)
def test_native_posting_equals_the_engine(name: str) -> None:
    """Every fault profile, both directions, SEND/WRITE only and every opcode mixed: identical
    runs posting natively and through the engine, the same posts taken."""
    faults = PROFILES[name]
    took = 0
    for seed in range(4):
        for ops in (_SEND_WRITE, tuple(WrOpcode)):
            off = fingerprint(seed, faults, _off(), ops)
            on = fingerprint(seed, faults, _on(), ops)
            assert on[:3] == off[:3], f"seed={seed} faults={name} ops={len(ops)}"
            assert on[3] == (off[3][1], 0), (on[3], off[3])
            took += on[3][0]
    print(f"{name}: {took} posts left natively")
    assert took > 4, took


@pytest.mark.parametrize("name", ["clean", "loss1", "reorder10"])
def test_latency_bound_posts_leave_natively(name: str) -> None:
    """One SEND or WRITE each way per round: most posts are the requester's whole work and leave
    natively (the rest are the engine's to hold: a credit limit, responder output queued); the
    runs equal the engine's."""
    eligible = took = 0
    for seed in range(3):
        off = latency_bound(seed, PROFILES[name], _off())
        on = latency_bound(seed, PROFILES[name], _on())
        assert on[:3] == off[:3], f"seed={seed} faults={name}"
        assert on[3] == (off[3][1], 0)
        eligible += 60
        took += on[3][0]
    print(f"{name}: {took} of {eligible} SEND/WRITE posts left natively")
    assert took >= 0.8 * eligible, (took, eligible)


def test_posting_at_once_or_at_the_pump_does_the_same_work() -> None:
    """Posting at once (natively) or at the next pump (no doorbell) changes when packets leave,
    not what the work does: the same memory and completions on a clean network."""
    for seed in range(3):
        now = latency_bound(seed, PROFILES["clean"], _on())
        pump = latency_bound(seed, PROFILES["clean"], _on(), post=False)
        assert now[0][1:] == pump[0][1:], f"seed={seed}"
        assert pump[3] == (0, 0)
