"""Segments of a GSO batch the network split, or GRO merged from another first segment.

A sender's segment *k* carries IPv4 ID *k* (``inet_gso_segment``). Where a hop
segments the batch, each datagram arrives alone; where GRO merges a run of
them, the run need not start at segment 0. Both codecs must accept a segment
whatever its place in what was read, as long as its ID is below
``SEGMENT_IDS``, and must refuse corrupted ones: a random corruption passes
with probability ``SEGMENT_IDS / 2**32`` = 2^-26 (``IcrcFlow.id_shift``).
"""

import random

import pytest

from rdmakit.transport import fastpath
from rdmakit.transport.codec import SegmentCodec
from rdmakit.transport.fastpath import PYTHON
from rdmakit.wire import SEGMENT_IDS, IcrcFlow, Opcode, Packet, encode, pack_icrc
from rdmakit.wire.ident import solve_ident_diff

WM = int(Opcode.RDMA_WRITE_MIDDLE)
MTU = 1024
SIZE = 12 + MTU + 4
CODECS: list[SegmentCodec] = [PYTHON] + ([fastpath.CODEC] if fastpath.native is not None else [])


def _flow() -> IcrcFlow:
    return IcrcFlow.ipv4(bytes((10, 28, 1, 2)), bytes((10, 28, 2, 2)), 51234, 4791)


def _batch(count: int, rng: random.Random, first_id: int = 0) -> tuple[list[Packet], list[bytes]]:
    """WRITE MIDDLE packets to QP 0x10 from PSN 100, segment i sent with IPv4 ID ``first_id + i``."""
    flow = _flow()
    pkts = [Packet(Opcode.RDMA_WRITE_MIDDLE, 0x10, 100 + i, payload=rng.randbytes(MTU)) for i in range(count)]
    segs = []
    for i, pkt in enumerate(pkts):
        body = encode(pkt)
        segs.append(body + pack_icrc(flow.icrc_seg(first_id + i, body)))
    return pkts, segs


def test_the_shifts_are_distinct_and_name_their_id() -> None:
    """64 distinct ICRC differences: exactly 64 of the 2^32 ICRCs are accepted for a segment."""
    for v6 in (False, True):
        for n in (16, 28, 268, SIZE, 4112):
            if v6:
                flow = IcrcFlow.ipv6(bytes(15) + b"\1", bytes(15) + b"\2", 1, 4791)
                assert set(flow.id_shifts(n)) == {0}  # no Identification in IPv6
                continue
            flow = _flow()
            shifts = flow.id_shifts(n)
            assert len(set(shifts)) == SEGMENT_IDS
            for d, v in enumerate(shifts):
                assert flow.id_shift(n, v) == d
                assert solve_ident_diff(n - 4, v) == d  # the 16-bit solver agrees
            assert shifts[1] ^ shifts[2] ^ shifts[4] == shifts[7]  # linear: one table for every k
            # IDs 64 .. 65535 are never taken for ones below 64.
            zero = flow.icrc_seg(0, bytes(n - 4))
            for i in (64, 100, 0x8000, 0xFFFF):
                diff = flow.icrc_seg(i, bytes(n - 4)) ^ zero
                assert solve_ident_diff(n - 4, diff) == i
                assert flow.id_shift(n, diff) is None


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_a_segment_alone_checks_with_any_id_below_64(codec: SegmentCodec) -> None:
    rng = random.Random(28)
    flow = _flow()
    pkts, segs = _batch(SEGMENT_IDS, rng)
    for i, seg in enumerate(segs):
        got = codec.check_decode(seg, 0, {}, flow)  # read alone: index 0 in its read
        assert type(got) is Packet, i
        assert got.psn == pkts[i].psn
    late = _batch(1, rng, first_id=SEGMENT_IDS)[1][0]  # ID 64: not one of ours
    assert codec.check_decode(late, 0, {}, flow) == 0


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_place_run_takes_a_split_or_merged_batch(codec: SegmentCodec) -> None:
    rng = random.Random(29)
    flow = _flow()
    pkts, segs = _batch(SEGMENT_IDS, rng)
    shifts = flow.id_shifts(SIZE)
    for start, count in ((0, 64), (5, 1), (17, 9), (40, 24), (63, 1)):
        buf = b"".join(segs[start : start + count])
        dst = bytearray(count * MTU)
        got = codec.place_run(
            buf, len(buf), SIZE, 0, flow.seg_states(SIZE, 64), WM, 0x10, 100 + start, MTU, dst, 0, 64, shifts
        )
        assert got == (count, -1), (start, count)
        assert dst == b"".join(p.payload for p in pkts[start : start + count])
        # Without the shifts, only a batch read from its first segment checks.
        states = flow.seg_states(SIZE, 64)
        got = codec.place_run(buf, len(buf), SIZE, 0, states, WM, 0x10, 100 + start, MTU, dst, 0, 64)
        assert got[0] == (count if start == 0 else 0)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_random_corruption_is_refused(codec: SegmentCodec) -> None:
    """Flipped bits anywhere in BTH, payload or ICRC, in segments read alone and in runs.

    Each corrupted segment passes with probability 2^-26 (64 of 2^32 ICRC
    values); over these trials a pass means the scheme accepts far more.
    """
    rng = random.Random(30)
    seed = rng.getrandbits(32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    flow = _flow()
    shifts = flow.id_shifts(SIZE)
    states = flow.seg_states(SIZE, 64)
    trials = 4000 if codec is PYTHON else 20000
    segs = _batch(SEGMENT_IDS, rng)[1]
    for _ in range(trials):
        i = rng.randrange(SEGMENT_IDS)
        seg = bytearray(segs[i])
        for _ in range(rng.choice((1, 1, 2, 3, 8))):
            pos = rng.choice((rng.randrange(12), rng.randrange(12, SIZE - 4), rng.randrange(SIZE - 4, SIZE)))
            if pos in (4,):  # BTH byte 4 is masked by the ICRC (Annex A17.3.3)
                pos = 20
            seg[pos] ^= 1 << rng.randrange(8)
        got = codec.check_decode(seg, rng.randrange(SEGMENT_IDS), {}, flow)
        assert type(got) is not Packet or bytes(seg) == segs[i], (seed, i)
        dst = bytearray(MTU)
        placed = codec.place_run(seg, SIZE, SIZE, 0, states, WM, 0x10, 100 + i, MTU, dst, 0, 1, shifts)
        assert placed[0] == 0 or bytes(seg) == segs[i], (seed, i)
