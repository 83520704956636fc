"""The armed responder within RDMA WRITEs of many packets equals the engine.

An armed responder (``_fastpath.Armed``, ``rdmakit.engine.armed``) executes
in-order RDMA WRITE FIRST, MIDDLE, LAST and ONLY without immediate data, and
may be armed between messages or within a WRITE. Three proofs that this
changes nothing, beside those of ``test_engine_small_native.py``:

- seeded hostile networks (every fault profile, both directions): random
  WRITEs of up to five packets (MTU 256), with a SEND or a WRITE with
  immediate now and then, leave the same trace, memory, completions,
  counters and state with and without it;
- on a clean network it takes every WRITE packet it is offered;
- crafted hostile message sequences with a valid ICRC (wrong PSN, opcode
  sequence, a MIDDLE where the LAST belongs and the other way, lengths for
  the packet's place, DMA length, R_Key, range, access,
  a WRITE LAST with immediate, the region deregistered mid-message, header
  defects): fed to two identical QPs, one through the engine alone and one
  through the armed responder first, they leave the same memory, state,
  completions, counters and response bytes, whether taken back after every
  packet (re-armed within the WRITE) or only now and then.
"""

import random
from collections import Counter
from typing import Any

import pytest

from rdmakit.engine import Access, QpState, WrOpcode
from rdmakit.testing.engine import ALL_ACCESS
from rdmakit.testing.faults import PROFILES
from rdmakit.transport import fastpath, simnet
from rdmakit.transport.small_ops import ARMED_OPS, take_small
from rdmakit.wire import RETH, Kind, Opcode, Packet
from tests.engine.seeds import SeedSample
from tests.engine.test_engine_small_native import (
    _IP_A,
    _IP_B,
    _WRITES,
    _compare,
    _datagram,
    _Responder,
    fingerprint,
)

pytestmark = pytest.mark.skipif(fastpath.NATIVE is None, reason=f"native data plane: {fastpath.describe()}")

#: Up to five packets at MTU 256 (FIRST, three MIDDLE, LAST).
_MAX_LEN = 1200


@pytest.mark.parametrize("name", PROFILES)
def test_armed_multi_packet_writes_equal_the_engine(name: str) -> None:
    _, _, armed = _compare(list(range(10)), PROFILES[name], _WRITES, _MAX_LEN)
    assert armed > 10 * 20, armed


@pytest.mark.slow
@pytest.mark.parametrize("name", PROFILES)
def test_armed_multi_packet_writes_equal_the_engine_many_seeds(name: str, seed_sample: SeedSample) -> None:
    seeds = seed_sample.seeds(range(2000, 2200), cap=40)
    assert _compare(seeds, PROFILES[name], _WRITES, _MAX_LEN)[2] > 0
    seed_sample.passed(len(seeds))


def test_armed_responder_takes_every_write_packet_on_a_clean_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """WRITEs only, of one to five packets: every WRITE packet the network delivers is
    executed by the armed responder (the first arms it, the rest find it armed)."""
    offered: Counter[str] = Counter()

    def counting(*a: Any) -> int:
        took = take_small(*a)
        op = a[2]
        if op in ARMED_OPS:
            offered[Opcode(op).name] += 1
            offered["taken" if took == 3 else "declined"] += 1
        return took

    monkeypatch.setattr(simnet, "take_small", counting)
    for seed in range(6):
        fingerprint(seed, PROFILES["clean"], fastpath.NATIVE, ops=(WrOpcode.RDMA_WRITE,), max_len=_MAX_LEN)
    assert offered["RDMA_WRITE_MIDDLE"] > 50, offered
    assert offered["RDMA_WRITE_FIRST"] > 50, offered
    assert offered["declined"] == 0, offered
    assert offered["taken"] == sum(offered[Opcode(op).name] for op in ARMED_OPS)


# -- crafted hostile message sequences ----------------------------------------------

#: The one thing ``craft`` gets wrong, if any.
DEFECTS = (
    "psn", "plen", "dma_len", "seq", "place", "imm", "rkey", "region", "range", "dereg", "pkey", "qpn",
    "tver", "pad", "trailing", "cut", "icrc",
)  # fmt: skip
#: Defects of a message's first packet (its RETH), and of a later one.
_STARTING = frozenset(("rkey", "region", "range", "dma_len"))
_WITHIN = frozenset(("imm", "place"))
_MTU = 256


def craft(rng: random.Random, r: _Responder, defect: str | None) -> bytes:
    """The next packet of a WRITE stream to ``r`` (as ``r``'s engine sees it), but for ``defect``."""
    resp = r.b.qp.resp
    psn = resp.psn
    if defect == "psn":
        psn = (psn + rng.choice((-1, 1, 2, 1 << 23))) & 0xFFFFFF
    within = resp.in_msg is Kind.WRITE
    if defect == "seq":
        within = not within
    if within:
        resid = resp.w_resid if resp.in_msg is Kind.WRITE else rng.randrange(1, 600)
        op = Opcode.RDMA_WRITE_MIDDLE if resid > _MTU else Opcode.RDMA_WRITE_LAST
        plen = _MTU if op is Opcode.RDMA_WRITE_MIDDLE else resid
        if defect == "plen":
            plen = rng.choice((0, 1, plen - 1, plen + 1, _MTU + 1)) if plen else 1
            plen = max(plen, 0)
        if (
            defect == "place"
        ):  # a MIDDLE where the LAST belongs (of an MTU: no room after it), or the other way
            op = Opcode.RDMA_WRITE_LAST if op is Opcode.RDMA_WRITE_MIDDLE else Opcode.RDMA_WRITE_MIDDLE
            plen = _MTU
        imm = None
        if defect == "imm":
            op, imm = Opcode.RDMA_WRITE_LAST_WITH_IMMEDIATE, 7
        pkt = Packet(op, r.b.qp.qpn, psn, payload=rng.randbytes(plen), imm=imm)
    else:
        mr = rng.choice((r.b.mr, r.b.mr, r.wo)) if defect != "region" else r.ro
        length = rng.choice((rng.randrange(_MTU + 1, 5 * _MTU), 2 * _MTU, 3 * _MTU + 1, rng.randrange(_MTU)))
        off = rng.randrange(0, mr.length - length) if mr.length > length else 0
        if defect == "range":
            off = rng.choice((mr.length - length + 1, mr.length, -1, -(1 << 40)))
        rkey = mr.rkey if defect != "rkey" else rng.choice((0, rng.getrandbits(32), r.b.mr.lkey))
        op = Opcode.RDMA_WRITE_FIRST if length > _MTU else Opcode.RDMA_WRITE_ONLY
        plen = min(length, _MTU)
        dma = length
        if defect == "plen":
            plen = rng.choice((plen - 1, plen + 1, 0)) if op is Opcode.RDMA_WRITE_FIRST else _MTU + 1
        elif defect == "dma_len":
            first = op is Opcode.RDMA_WRITE_FIRST
            dma = rng.choice((0, _MTU - 1, _MTU, (1 << 31) + 1)) if first else length + 1
        va = (mr.addr + off) & ((1 << 64) - 1)
        pkt = Packet(op, r.b.qp.qpn, psn, reth=RETH(va, rkey, dma), payload=rng.randbytes(max(plen, 0)))
    pkt = pkt._replace(ackreq=rng.random() < 0.5, se=rng.random() < 0.1, fecn=rng.random() < 0.1)
    return _datagram(rng, pkt, defect, _IP_A, _IP_B)


@pytest.mark.parametrize("taken_back", ["every_packet", "now_and_then"])
@pytest.mark.parametrize("access", ["all", "read"])
def test_crafted_hostile_write_sequences_equal_the_engine(access: str, taken_back: str) -> None:
    """``every_packet``: compared (so taken back, and armed again within the WRITE) after every
    packet; ``now_and_then``: the armed responder keeps the message across packets."""
    acc = ALL_ACCESS if access == "all" else Access.LOCAL_WRITE | Access.REMOTE_READ
    executed: Counter[str | None] = Counter()
    for seed in range(200):
        ref, nat = _Responder(seed, 4, acc), _Responder(seed, 4, acc)
        rng = random.Random(seed * 104729)
        for i in range(80):
            within = ref.b.qp.resp.in_msg is Kind.WRITE
            defect = rng.choice(DEFECTS) if rng.random() < 0.15 else None
            if defect in (_STARTING if within else _WITHIN):
                defect = "seq"  # (the defect has no field to go in: the packet's place is wrong instead)
            if defect == "dereg":
                if ref.wo.rkey in ref.b.pd.remote_table:  # the WRITE-only region goes, maybe mid-message
                    for side in (ref, nat):
                        side.b.pd.deregister(side.wo)
                defect = None
            d = craft(rng, ref, defect)

            def took(n: int, defect: str | None = defect) -> None:
                if n == 3:
                    executed[defect] += 1

            ref.feed(d, None)
            nat.feed(d, None, took)
            over = ref.b.qp.state is QpState.ERR  # a class A/C error
            if taken_back == "every_packet" or i % 5 == 4 or over or i == 79:
                assert nat.fingerprint() == ref.fingerprint(), f"seed={seed} packet {i} {defect}"
            if over:
                break
    if access == "all":
        assert executed[None] > 300, executed
    else:
        assert not executed, executed  # a QP without REMOTE_WRITE: nothing is executed
    always = {
        "psn",
        "seq",
        "place",
        "imm",
        "rkey",
        "region",
        "range",
        "pkey",
        "qpn",
        "tver",
        "trailing",
        "cut",
    }
    always.add("icrc")
    assert not always & set(executed), executed
