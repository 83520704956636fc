"""Operation-at-a-time workloads on a seeded SimNet, fingerprinted for the one-packet paths' proofs.

``fingerprint`` runs rounds of one to three random operations from each side
at the other, both directions at once, waiting for a round's completions
before the next is posted (as a latency-bound application does, and the only
way the requester's one-packet send path, ``QueuePair.tx_small``, is asked
at all: it serves a QP whose whole work is one request). Every completion,
both memories, the counters, the requester and responder state, the trace
and virtual time go into the fingerprint, so two runs of one seed with and
without a path compare in one ``==``.
"""

import random
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rdmakit.engine import QpCaps, QueuePair, WrOpcode
from rdmakit.testing.engine import Pair, Workload, make_pair
from rdmakit.testing.faults import Faults
from rdmakit.transport.codec import SegmentCodec
from rdmakit.wire import Opcode, Packet, encode
from tests.engine.qp_state import requester_state, responder_state

#: Bytes of each round's source and target areas (three operations of at most MAX_LEN, an atomic's 64).
_STRIDE = 2048
MAX_LEN = 300
#: The one-packet requests ``tx_small`` may send (SEND and WRITE of at most an MTU).
TX_OPCODES = frozenset((
    Opcode.SEND_ONLY, Opcode.SEND_ONLY_WITH_IMMEDIATE, Opcode.RDMA_WRITE_ONLY,
    Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE, Opcode.RDMA_READ_REQUEST, Opcode.COMPARE_SWAP, Opcode.FETCH_ADD,
))  # fmt: skip


def fingerprint(
    seed: int,
    faults: Faults,
    small: SegmentCodec | None,
    *,
    rounds: int = 10,
    window: int = 128,
    cnp_every: int = 0,
) -> tuple[Any, ...]:
    """Run ``rounds`` rounds (MTU 256, up to ``MAX_LEN`` bytes: one and two packets); the last
    item is what the one-packet paths took, the rest is the run.

    ``window``: the requesters' window in PSNs; ``cnp_every``: every that many
    rounds, a CNP reaches both requesters (DCQCN then paces them).
    """
    half = rounds * _STRIDE
    caps = QpCaps(max_unacked_psns=window)
    p = make_pair(seed, faults, mem_size=2 * half, mtu=256, small=small, caps=caps)
    rng = random.Random(seed ^ 0x0E1E)
    p.a.mem[:] = rng.randbytes(len(p.a.mem))
    p.b.mem[:] = rng.randbytes(len(p.b.mem))
    done: list[Any] = []
    for r in range(rounds):
        base = r * _STRIDE
        w1 = Workload(p.a, p.b, rng, rng.choice((1, 1, 1, 2, 3)), MAX_LEN, base, half + base)
        w2 = Workload(p.b, p.a, rng, rng.choice((1, 1, 2)), MAX_LEN, base, half + base)
        w1.post()
        w2.post()
        if cnp_every and r % cnp_every == 0:
            p.a.qp.cnp_received(p.net.now)
            p.b.qp.cnp_received(p.net.now)
        assert p.net.run(until=_round_done(p, w1, w2), max_time=600.0), f"seed={seed} round {r}"
        w1.check()
        w2.check()
        done += [(s.name, c) for s in (p.a, p.b) for c in (*s.sent, *s.received)]
        for s in (p.a, p.b):
            s.sent.clear()
            s.received.clear()
    p.net.run(max_time=p.net.now + 1.0)  # the last ACKs and duplicates settle
    p.drain()
    done += [(s.name, c) for s in (p.a, p.b) for c in (*s.sent, *s.received)]
    paths = ("small", "small_resp", "armed", "small_tx", "armed_req", "armed_read", "armed_atomic")
    taken: dict[str, Any] = {k: p.net.stats.pop(k, 0) for k in paths}
    qa, qb = p.a.qp, p.b.qp
    for q in (qa, qb):
        q.disarm()  # an armed responder's state back to the engine, which is what is compared
    taken["qpns"] = {qa.qpn: "a", qb.qpn: "b"}
    return (
        (p.net.now, bytes(p.a.mem), bytes(p.b.mem), tuple(done)),
        (qa.stats, qb.stats, responder_state(qa), responder_state(qb)),
        (requester_state(qa), requester_state(qb)),
        (p.net.trace_digest(), dict(p.net.stats)),
        taken,
    )


def _round_done(p: Pair, w1: Workload, w2: Workload) -> Callable[[], bool]:
    def done() -> bool:
        p.drain()
        return (
            len(p.a.sent) >= w1.n_signaled
            and len(p.b.received) >= len(w1.expect_recv)
            and len(p.b.sent) >= w2.n_signaled
            and len(p.a.received) >= len(w2.expect_recv)
        )

    return done


@contextmanager
def counting_tx() -> Iterator[Counter[tuple[int, int]]]:
    """Count what ``QueuePair.tx_small`` sends, by (QPN, opcode), while the block runs."""
    taken: Counter[tuple[int, int]] = Counter()
    orig = QueuePair.tx_small

    def tx_small(self: QueuePair, now: float) -> Packet | None:
        pkt = orig(self, now)
        if pkt is not None:
            taken[(self.qpn, int(pkt.opcode))] += 1
        return pkt

    QueuePair.tx_small = tx_small  # type: ignore[method-assign, assignment]
    try:
        yield taken
    finally:
        QueuePair.tx_small = orig  # type: ignore[method-assign]


def port_order(seed: int, use_tx: bool) -> tuple[Any, ...]:
    """A request posted while the QP's responder has output queued, sent as the UDP port sends
    (``tx_small`` first when ``use_tx``, else ``poll_transmit``): what goes out, in order, and the state.

    ``SimNet`` cannot reach this: its pump sends all output at once, before anything new is
    posted. A port can: its user posts at any moment, a receive may have queued an ACK or a
    READ response since its last transmit.
    """
    p = make_pair(seed, None, mem_size=4096, mtu=256)
    rng = random.Random(seed)
    a, b = p.a, p.b
    out: list[bytes] = []
    for op in TX_WRS:
        w = Workload(a, b, rng, 1, 64, 0, 1024)
        w.post((op,))
        for pkt in a.qp.poll_transmit(0.0):
            b.qp.receive(pkt, 0.0)  # b's responder now has output queued
        r = Workload(b, a, rng, 1, 64, 2048, 3072)
        r.post((op,))
        one = b.qp.tx_small(0.0) if use_tx else None
        pkts = [one] if one is not None else b.qp.poll_transmit(0.0)
        out += [bytes(encode(x)) for x in pkts]
        for pkt in pkts:
            a.qp.receive(pkt, 0.0)
        for pkt in a.qp.poll_transmit(0.0):
            b.qp.receive(pkt, 0.0)
        p.drain()
    return tuple(out), requester_state(b.qp), responder_state(b.qp), tuple(b.sent), bytes(a.mem), bytes(b.mem)


#: The work requests whose request is one packet (at 64 bytes and MTU 256).
TX_WRS = (
    WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM,
    WrOpcode.RDMA_READ, WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD,
)  # fmt: skip
