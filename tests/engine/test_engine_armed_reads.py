"""The armed responder's RDMA READs and atomics equal the engine.

An armed responder (``_fastpath.Armed``, ``rdmakit.engine.armed``) executes the
in-order READ request between messages (up to eight responses), records its
responder resource in the engine's ring (``RdAtomicResources.new_read``) and holds
its responses, which the transport takes (``take_reply``, ``send_reply``) or the
engine takes back (``disarm``: a ``ReadReply`` behind the held ACK). The proofs:

- seeded hostile networks (every fault profile, both directions): READs of one to
  five packets (MTU 256) and atomics (held as an ATOMIC ACKNOWLEDGE, their original
  value recorded by ``RdAtomicResources.new_atomic``) mixed with WRITE and SEND, all posted at once and
  in rounds (with CNPs, so DCQCN paces the responses and the engine takes them back),
  leave the same trace, memory, completions, counters and state with and without
  the native paths;
- latency-bound READs, one each way per round: on a clean network the armed
  responder executes every READ request, and what a duplicate READ finds in the
  ring is what the engine recorded;
- crafted hostile READ requests with a valid ICRC (PSN, R_Key, range, region,
  DMA length, header defects and trailing bytes, a READ inside a WRITE, a QP
  without REMOTE_READ or without responder resources, a READ longer than the
  native path takes), fed to two identical QPs, one through the engine alone:
  the same memory, state, completions, counters and response bytes (hostile
  atomics are fed to the armed responder by ``test_engine_small_native``'s
  crafted requests);
"""

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from rdmakit.engine import SGE, Access, CompletionQueue, QpState, QueuePair, SendWR, WcStatus, WrOpcode
from rdmakit.testing.engine import ALL_ACCESS, make_pair, rounds_each_way
from rdmakit.testing.faults import PROFILES, Faults
from rdmakit.transport import fastpath
from rdmakit.transport.codec import ArmedOwner
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.transport.roce_armed import ArmedSends
from rdmakit.wire import RETH, Opcode, Packet
from tests.engine import small_run
from tests.engine.seeds import SeedSample
from tests.engine.test_engine_small_native import _IP_A, _IP_B, _codec, _datagram, _Responder, fingerprint

pytestmark = pytest.mark.skipif(fastpath.NATIVE is None, reason=f"native data plane: {fastpath.describe()}")

_MTU = 256
#: READ-heavy, with what a READ meets in practice.
_MIXED = (
    WrOpcode.RDMA_READ, WrOpcode.RDMA_READ, WrOpcode.RDMA_READ, WrOpcode.RDMA_WRITE, WrOpcode.SEND,
    WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.RDMA_WRITE_WITH_IMM,
)  # fmt: skip


@pytest.mark.parametrize("name", PROFILES)
def test_armed_reads_and_atomics_equal_the_engine(name: str) -> None:
    faults = PROFILES[name]
    reads = atomics = 0
    for seed in range(6):
        ref = fingerprint(seed, faults, None, ops=_MIXED, max_len=1200)
        got = fingerprint(seed, faults, _codec(), ops=_MIXED, max_len=1200)
        assert ref[3] == (0,) * 7
        assert got[:3] == ref[:3], f"seed={seed} faults={name}"
        reads += got[3][5]
        atomics += got[3][6]
    for seed in range(4):
        for cnp in (0, 3):
            ref = small_run.fingerprint(seed, faults, None, cnp_every=cnp)
            got = small_run.fingerprint(seed, faults, _codec(), cnp_every=cnp)
            assert got[:4] == ref[:4], f"seed={seed} faults={name} rounds cnp={cnp}"
            reads += got[4]["armed_read"]
            atomics += got[4]["armed_atomic"]
    print(f"{name}: the armed responder executed {reads} READs and {atomics} atomics")
    assert reads > 10, reads
    assert atomics > 10, atomics


@pytest.mark.slow
@pytest.mark.parametrize("name", PROFILES)
def test_armed_reads_and_atomics_equal_the_engine_many_seeds(name: str, seed_sample: SeedSample) -> None:
    seeds = seed_sample.seeds(range(3000, 3200), cap=30)
    taken = 0
    for seed in seeds:
        ref = fingerprint(seed, PROFILES[name], None, ops=_MIXED, max_len=1200)
        got = fingerprint(seed, PROFILES[name], _codec(), ops=_MIXED, max_len=1200)
        assert got[:3] == ref[:3], f"seed={seed} faults={name}"
        taken += got[3][5] + got[3][6]
    assert taken > 0
    seed_sample.passed(len(seeds))


def _latency_bound(seed: int, faults: Faults, native: bool, rounds: int = 30) -> tuple[Any, ...]:
    """Rounds of one READ (one to five responses) each way, each round waited for."""
    p = make_pair(seed, faults, mem_size=1 << 16, mtu=_MTU, small=_codec() if native else None)
    rng = random.Random(seed)
    p.a.mem[:] = rng.randbytes(len(p.a.mem))
    p.b.mem[:] = rng.randbytes(len(p.b.mem))
    done = rounds_each_way(p, rng, seed, rounds, (WrOpcode.RDMA_READ,), 1200, 2048)
    taken = {k: p.net.stats.pop(k, 0) for k in ("small", "small_resp", "small_tx", "armed_read", "armed_req")}
    for qp in (p.a.qp, p.b.qp):
        qp.disarm()
    rings = [
        [None if x is None else (x.kind, x.first_psn, x.last_psn, x.va, x.length, x.rkey) for x in ring]
        for ring in (p.a.qp.resp.res.ring, p.b.qp.resp.res.ring)
    ]
    run = (p.net.now, bytes(p.a.mem), bytes(p.b.mem), tuple(done), p.net.trace_digest(), dict(p.net.stats))
    return run, rings, taken


@pytest.mark.parametrize("name", ["clean", "loss1", "reorder10"])
def test_the_armed_responder_executes_nearly_every_read(name: str) -> None:
    """2 x 30 READs per seed, 3 seeds: on a clean network the armed responder executes every
    one of them (the first arms it); with loss or reordering, nearly every one (a duplicate,
    or a request behind a gap, is the engine's)."""
    eligible = taken = 0
    for seed in range(3):
        off = _latency_bound(seed, PROFILES[name], False)
        on = _latency_bound(seed, PROFILES[name], True)
        assert on[:2] == off[:2], f"seed={seed} faults={name}"
        eligible += 60
        taken += on[2]["armed_read"]
    print(f"{name}: the armed responder executed {taken} of {eligible} READ requests")
    assert taken == eligible if name == "clean" else taken >= 0.7 * eligible, (taken, eligible)


# -- crafted hostile READ requests -----------------------------------------------------

DEFECTS = (
    "psn", "rkey", "region", "range", "dma_len", "long", "pkey", "qpn", "tver", "pad", "trailing", "cut",
    "icrc", "write_first",
)  # fmt: skip


def craft(rng: random.Random, r: _Responder, defect: str | None) -> bytes:
    """A READ request for ``r`` (zero to five responses), but for ``defect``."""
    qp = r.b.qp
    psn = qp.resp.psn
    if defect == "psn":
        psn = (psn + rng.choice((-1, 1, 2, -5, 1 << 23))) & 0xFFFFFF
    mr = r.b.mr if defect != "region" else r.wo
    length = rng.choice((0, 1, 8, 255, 256, 257, 700, 5 * _MTU))
    if defect in ("rkey", "region", "range") and not length:
        length = 8  # a zero-length READ names no memory: no R_Key is checked (rxe check_rkey)
    if defect == "long":
        length = rng.choice((8 * _MTU + 1, 2048 + 100))
    span = mr.length
    off = rng.randrange(0, span - length) if span > length else 0
    if defect == "range":
        off = rng.choice((span - length + 1, span, -1, -(1 << 40)))
    rkey = mr.rkey if defect != "rkey" else rng.choice((0, rng.getrandbits(32), r.b.mr.lkey))
    dma = length if defect != "dma_len" else rng.choice(((1 << 31) + 1, 1 << 32 - 1, span + 1))
    va = (mr.addr + off) & ((1 << 64) - 1)
    if defect == "write_first":  # a WRITE FIRST opens a message: the READ after it is out of sequence
        pkt = Packet(Opcode.RDMA_WRITE_FIRST, qp.qpn, psn, reth=RETH(va, rkey, 600), payload=bytes(_MTU))
    else:
        pkt = Packet(Opcode.RDMA_READ_REQUEST, qp.qpn, psn, reth=RETH(va, rkey, dma))
    pkt = pkt._replace(ackreq=rng.random() < 0.5, se=rng.random() < 0.1, fecn=rng.random() < 0.1)
    return _datagram(rng, pkt, defect if defect != "write_first" else None, _IP_A, _IP_B)


@pytest.mark.parametrize("setup", ["read", "all", "no_read_access", "no_resources"])
def test_crafted_hostile_read_requests_equal_the_engine(setup: str) -> None:
    access = {
        "read": Access.LOCAL_WRITE | Access.REMOTE_READ,
        "no_read_access": Access.LOCAL_WRITE | Access.REMOTE_WRITE,
    }.get(setup, ALL_ACCESS)
    executed: Counter[str | None] = Counter()
    for seed in range(120):
        rd = 0 if setup == "no_resources" else 4
        ref, nat = _Responder(seed, rd, access), _Responder(seed, rd, access)
        rng = random.Random(seed * 7919)
        for i in range(40):
            defect = rng.choice(DEFECTS) if rng.random() < 0.3 else None
            d = craft(rng, ref, defect)

            def took(n: int, defect: str | None = defect) -> None:
                if n == 5:
                    executed[defect] += 1

            ref.feed(d, None)
            nat.feed(d, None, took)
            over = ref.b.qp.state is QpState.ERR
            if i % 3 == 2 or over or i == 39:
                assert nat.fingerprint() == ref.fingerprint(), f"seed={seed} request {i} {defect}"
            if over:
                break
    if setup in ("read", "all"):
        assert executed[None] > 500, executed
    else:
        assert not executed, executed
    never = {"psn", "rkey", "region", "range", "dma_len", "long", "pkey", "qpn", "tver", "pad", "trailing"}
    never |= {"cut", "icrc", "write_first"}
    assert not never & set(executed), executed


# -- on real sockets -----------------------------------------------------------------------


def test_the_port_sends_read_responses_natively(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over two soft devices on loopback (MTU 1024), READs of zero to eight responses, padded and
    not: the armed responder sends their responses itself (``send_reply``), and the requester
    receives every one with a good ICRC and header, and the right bytes."""
    replies = []
    real = ArmedSends._send_ack

    def counting(self: ArmedSends, owner: ArmedOwner, qp: QueuePair, now: float) -> bool:
        replying = owner.replying
        left = real(self, owner, qp, now)
        replies.append((replying, left))
        return left

    monkeypatch.setattr(ArmedSends, "_send_ack", counting)
    mtu = 1024
    lengths = (0, 1, 5, 8, mtu - 1, mtu, mtu + 1, 3 * mtu + 7, 8 * mtu)
    with SoftDevice(new_ip(), port=0) as a, SoftDevice(new_ip(), port=0) as b, Driver() as drv:
        drv.add(a)
        drv.add(b)
        cqa, cqb = CompletionQueue(64), CompletionQueue(64)
        qa = a.create_qp(send_cq=cqa, recv_cq=cqa)
        qb = b.create_qp(send_cq=cqb, recv_cq=cqb)
        ma, mb = bytearray(16 * mtu), bytearray(random.Random(7).randbytes(16 * mtu))
        mra = a.pd.register(ma, 0x1000, ALL_ACCESS)
        mrb = b.pd.register(mb, 0x9000, ALL_ACCESS)
        connect_qp(a, qa, 10, local_endpoint(b, qb, 20, mtu))
        connect_qp(b, qb, 20, local_endpoint(a, qa, 10, mtu))
        # A WRITE first arms b's responder (take_small), binding it for the device poll.
        qa.post_send(SendWR(wr_id=99, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000, 8, mra.lkey),),
                            remote_addr=0x9000 + 15 * mtu, rkey=mrb.rkey))  # fmt: skip
        assert drv.run_until(lambda: len(cqa) > 0, 10.0)
        assert cqa.poll()[0].status is WcStatus.SUCCESS
        for i, n in enumerate(lengths):
            at = (i * 131) % (7 * mtu)
            sge = SGE(0x1000 + at, n, mra.lkey) if n else None
            qa.post_send(SendWR(wr_id=i, opcode=WrOpcode.RDMA_READ, sg_list=(sge,) if sge else (),
                                remote_addr=0x9000 + at + 1, rkey=mrb.rkey))  # fmt: skip
            assert drv.run_until(lambda: len(cqa) > 0, 10.0)
            (wc,) = cqa.poll()
            assert wc.status is WcStatus.SUCCESS, n
            assert ma[at : at + n] == mb[at + 1 : at + 1 + n], n
        # (a response of the wrong length is dropped, and the READ retried: it must not be)
        assert not qa.stats.dropped["bad_response_length"], qa.stats
    assert a.counters.bad_icrc == 0
    assert a.counters.malformed == 0
    sent = sum(1 for replying, left in replies if replying and left)
    assert sent >= len(lengths) - 1, replies  # (a loaded host may let one go the generic way)
