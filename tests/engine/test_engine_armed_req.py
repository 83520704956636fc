"""The requester's ACKs retired natively (``_fastpath.ArmedReq``) equal the Python engine.

``ArmedReq.rx`` takes an in-order ACK of whole sent SEND/WRITE WQEs: it pops them, pushes
their completions to the send CQ, and logs what the congestion rules own, which
``QueuePair.acks_taken`` applies at once (``rdmakit.engine.armed_req``). The proofs:

- seeded hostile networks (every fault profile, both directions): the same random
  workloads with the native ACK path on and off (and with no native path at all) leave
  the same trace, memory, completions in order, counters, requester and responder state
  and virtual time;
- a latency-bound WRITE/SEND workload in which the native path retires nearly every WQE;
- crafted ACKs (NAK, RNR NAK, a duplicate, past what was sent, inside a message, a bad
  ICRC, a full CQ) are declined with nothing changed.
"""

import copy
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest

from rdmakit.engine import SGE, Completion, QueuePair, SendWR, WcOpcode, WcStatus, WrOpcode
from rdmakit.engine.armed_req import AckLog
from rdmakit.testing.engine import make_pair, rounds_each_way
from rdmakit.testing.faults import PROFILES, Faults
from rdmakit.transport import fastpath
from rdmakit.transport.codec import SegmentCodec
from rdmakit.transport.small_ops import take_small
from rdmakit.wire import IcrcFlow
from tests.engine import small_run
from tests.engine import test_engine_small_native as native

pytestmark = pytest.mark.skipif(fastpath.NATIVE is None, reason=f"native data plane: {fastpath.describe()}")

#: The operations whose ACK the native path retires (and, now and then, ones it does not).
_SEND_WRITE = (WrOpcode.RDMA_WRITE, WrOpcode.SEND, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.SEND_WITH_IMM)


def _on() -> SegmentCodec:
    assert fastpath.NATIVE is not None
    assert fastpath.NATIVE.arm_req is not None
    return fastpath.NATIVE


def _off() -> SegmentCodec:
    """The same native codec without the native ACK path."""
    codec = copy.copy(_on())
    codec.arm_req = None
    return codec


@contextmanager
def counting_retired() -> Iterator[list[int]]:
    """[ACKs, WQEs] the native path retired while the block runs."""
    got = [0, 0]
    orig = QueuePair.acks_taken

    def acks_taken(self: QueuePair, log: AckLog) -> None:
        got[0] += len(log)
        got[1] += sum(len(e[3]) for e in log)
        orig(self, log)

    QueuePair.acks_taken = acks_taken  # type: ignore[method-assign, assignment]
    try:
        yield got
    finally:
        QueuePair.acks_taken = orig  # type: ignore[method-assign]


@pytest.mark.parametrize("name", PROFILES)
def test_armed_requester_equals_the_engine(name: str) -> None:
    """Every fault profile, both directions, two workloads (all posted at once; rounds of one to
    three operations): identical runs with the native ACK path on, off, and no native path."""
    faults = PROFILES[name]
    taken = 0
    for seed in range(6):
        for ops in (_SEND_WRITE, tuple(WrOpcode)):
            off = native.fingerprint(seed, faults, _off(), ops=ops)
            on = native.fingerprint(seed, faults, _on(), ops=ops)
            assert off[3][4] == 0
            assert on[:3] == off[:3], f"seed={seed} faults={name} ops={len(ops)}"
            taken += on[3][4]
        off = small_run.fingerprint(seed, faults, _off())
        on = small_run.fingerprint(seed, faults, _on())
        ref = small_run.fingerprint(seed, faults, None)
        assert on[:4] == off[:4] == ref[:4], f"seed={seed} faults={name} rounds"
        taken += on[4]["armed_req"]
    assert taken > 6 * 10, taken


def _latency_bound(seed: int, faults: Faults, codec: SegmentCodec, rounds: int = 40) -> tuple[Any, ...]:
    """Rounds of one SEND or WRITE (with or without immediate) each way, each round waited for."""
    p = make_pair(seed, faults, mem_size=1 << 16, mtu=256, small=codec)
    rng = random.Random(seed)
    p.a.mem[:] = rng.randbytes(len(p.a.mem))
    p.b.mem[:] = rng.randbytes(len(p.b.mem))
    done = rounds_each_way(p, rng, seed, rounds, _SEND_WRITE, 200, 1024)
    for k in ("armed_req", "small_resp"):  # which path took the ACK (the run is compared)
        p.net.stats.pop(k, None)
    return p.net.now, bytes(p.a.mem), bytes(p.b.mem), tuple(done), p.net.trace_digest(), dict(p.net.stats)


@pytest.mark.parametrize("name", ["clean", "loss1", "reorder10"])
def test_the_native_path_retires_nearly_every_send_and_write(name: str) -> None:
    """A latency-bound SEND/WRITE workload: 2 x 40 WQEs per seed, 4 seeds; on a clean network the
    native path retires every one of them, on a lossy or reordering one nearly every one."""
    eligible = retired = 0
    for seed in range(4):
        off = _latency_bound(seed, PROFILES[name], _off())
        with counting_retired() as got:
            on = _latency_bound(seed, PROFILES[name], _on())
        assert on == off, f"seed={seed} faults={name}"
        eligible += 80
        retired += got[1]
    print(f"{name}: the native path retired {retired} of {eligible} SEND/WRITE WQEs")
    assert retired == eligible if name == "clean" else retired >= 0.8 * eligible, (retired, eligible)


class _AckCodec:
    """Only the native ACK path (``take_small`` offers it every ACK), counting what it took."""

    small_request = None
    small_response = None
    arm = None

    def __init__(self) -> None:
        self.taken = 0
        real = _on().arm_req
        assert real is not None

        def arm_req(*ticket: Any) -> Any:
            owner = real(*ticket)
            codec = self

            class Counted:
                def rx(self, *a: Any) -> bool:
                    took = bool(owner.rx(*a))
                    codec.taken += took
                    return took

                def take(self) -> AckLog:
                    return owner.take()

            return Counted()

        self.arm_req = arm_req


def _fill_cq(r: Any) -> None:
    """The send CQ full (the next completion overruns it)."""
    cq = r.a.qp.send_cq
    while len(cq) < cq.depth:
        cq.push(Completion(wr_id=0, status=WcStatus.SUCCESS, opcode=WcOpcode.SEND))


def test_crafted_acks_equal_the_engine() -> None:
    """Responses crafted to complete the head (ACKs, cumulative ACKs past it) with and without a
    defect: through the native ACK path first, or the engine alone, the same memory, state,
    completions, counters and output; no defective ACK is ever taken natively."""
    taken: dict[str | None, int] = {}
    for seed in range(150):
        ref, nat = native._Requester(seed), native._Requester(seed)
        rng = random.Random(seed * 7919)
        codec = _AckCodec()
        flow = IcrcFlow.ipv4(native._IP_B, native._IP_A, 0xC000, 4791)
        for i in range(50):
            while not nat.a.qp.req.sq or rng.random() < 0.3:
                if nat.a.qp.req.sq and rng.random() < 0.1:
                    for r in (ref, nat):  # a local error behind what is in flight (LOC_PROT_ERR)
                        bad = SGE(r.a.mr.addr, 8, r.a.mr.lkey ^ 0x100)
                        r.a.qp.post_send(SendWR(wr_id=7, opcode=WrOpcode.SEND, sg_list=(bad,)))
                    continue
                state = rng.getstate()
                ref.post(rng)
                rng.setstate(state)
                nat.post(rng)
            defect = rng.choice((*native._RESP_DEFECTS, "cq_full")) if rng.random() < 0.3 else None
            state = rng.getstate()
            d1 = native.craft_response(rng, ref, defect)
            rng.setstate(state)
            d2 = native.craft_response(rng, nat, defect)
            assert d1 == d2
            if defect == "cq_full":
                _fill_cq(ref)
                _fill_cq(nat)
            ref.feed(d1, None)
            before = codec.taken
            qp = nat.a.qp
            if take_small(cast(SegmentCodec, codec), qp, d2[0], d2, 0, flow.states, flow, nat.now):
                nat._drain()
            else:
                nat.feed(d2, None)
            if codec.taken > before:
                taken[defect] = taken.get(defect, 0) + 1
            assert nat.fingerprint() == ref.fingerprint(), f"seed={seed} response {i} {defect}"
            if ref.a.qp.state.name == "ERR":
                break
    assert taken.get(None, 0) > 300, taken
    # ("length" changes only a READ response's payload: an ACK with it is a good ACK.)
    never = {"opcode", "nak", "rnr", "pkey", "qpn", "tver", "pad", "trailing", "cut", "icrc", "cq_full"}
    assert not never & set(taken), taken
