"""The native placement's one-pass ICRC check (``_fastpath.icrc_one_pass``).

``place_run`` and ``recv_runs`` check a MIDDLE segment's ICRC (Annex A17.3.3) in
one pass over the segment as received, resv8a and ICRC included, instead of the
masked BTH by table and the payload by folding. Whatever the one pass does not
take, the long way checks as before, so a check that took nothing would still
place correctly: these tests hold the one pass to taking every good segment and
nothing else.
"""

import random

import pytest

from rdmakit.transport import fastpath
from rdmakit.wire import IcrcFlow, Opcode, Packet, encode, pack_icrc

pytestmark = pytest.mark.skipif(fastpath.native is None, reason="needs the native data plane")

MTUS = (256, 512, 1024, 2048, 4096)


def _flow() -> IcrcFlow:
    return IcrcFlow.ipv4(bytes((10, 29, 1, 2)), bytes((10, 29, 2, 2)), 50123, 4791)


def _segment(mtu: int, ident: int, rng: random.Random) -> bytes:
    body = encode(Packet(Opcode.RDMA_WRITE_MIDDLE, 0x21, rng.getrandbits(24), payload=rng.randbytes(mtu)))
    return body + pack_icrc(_flow().icrc_seg(ident, body))


@pytest.mark.parametrize("mtu", MTUS)
def test_every_good_segment_checks_in_one_pass(mtu: int) -> None:
    native = fastpath.native
    assert native is not None
    rng = random.Random(mtu)
    flow = _flow()
    size = 12 + mtu + 4
    for ident in (0, 1, 17, 63):
        seg = _segment(mtu, ident, rng)
        assert native.icrc_one_pass(flow.state(size, ident), seg)
        # the state of another IPv4 ID: the long way decides (id_shifts)
        assert not native.icrc_one_pass(flow.state(size, ident ^ 1), seg)


@pytest.mark.parametrize("mtu", (256, 1024))
def test_no_corrupted_segment_checks_in_one_pass(mtu: int) -> None:
    native = fastpath.native
    assert native is not None
    rng = random.Random(7 + mtu)
    flow = _flow()
    size = 12 + mtu + 4
    seg = _segment(mtu, 3, rng)
    state = flow.state(size, 3)
    for pos in range(size):  # every byte, the BTH's and the ICRC's included
        bad = bytearray(seg)
        bad[pos] ^= 1 << rng.randrange(8)
        assert not native.icrc_one_pass(state, bad), pos


def test_resv8a_set_is_left_to_the_long_way() -> None:
    """The ICRC masks resv8a, so a segment with it set can still check: not in one pass."""
    native = fastpath.native
    assert native is not None
    rng = random.Random(3)
    seg = bytearray(_segment(1024, 0, rng))
    seg[4] = 0x5A
    assert not native.icrc_one_pass(_flow().state(len(seg), 0), seg)
    got, _last = native.place_run(
        seg, len(seg), len(seg), 0, _flow().seg_states(len(seg), 1), int(Opcode.RDMA_WRITE_MIDDLE),
        0x21, int.from_bytes(seg[9:12]), 1024, bytearray(1024), 0, 1,
    )  # fmt: skip
    assert got == 1  # the long way took it


def test_hostile_arguments_are_refused() -> None:
    native = fastpath.native
    assert native is not None
    assert not native.icrc_one_pass(0, b"")
    assert not native.icrc_one_pass(0, bytes(16))
    assert not native.icrc_one_pass(1 << 32, bytes(64))
    assert not native.icrc_one_pass(-1, bytes(64))  # no state wraps into range
    with pytest.raises(TypeError):
        native.icrc_one_pass(0, "segment")
