"""Recovering the IPv4 Identification from an ICRC (rdmakit.wire.ident)."""

from hypothesis import given
from hypothesis import strategies as st

from rdmakit.wire import icrc_ipv4
from rdmakit.wire.ident import solve_ipv4_ident

SRC, DST = bytes([10, 77, 0, 1]), bytes([10, 77, 0, 2])


@given(
    body=st.binary(min_size=12, max_size=600),
    ident=st.integers(0, 0xFFFF),
    sport=st.integers(0, 0xFFFF),
    df=st.booleans(),
)
def test_solves_any_identification(body: bytes, ident: int, sport: int, df: bool) -> None:
    icrc = icrc_ipv4(SRC, DST, sport, 4791, body, ident=ident, df=df)
    assert solve_ipv4_ident(SRC, DST, sport, 4791, body, icrc, df=df) == ident


@given(body=st.binary(min_size=12, max_size=600), ident=st.integers(0, 0xFFFF), bit=st.integers(0, 31))
def test_single_bit_corruption_of_the_icrc_is_never_explained(body: bytes, ident: int, bit: int) -> None:
    icrc = icrc_ipv4(SRC, DST, 49152, 4791, body, ident=ident)
    # The 16 ID bits move the CRC in a 16-dimensional subspace; a one-bit error
    # would have to be one of its vectors, which a CRC-32 never makes.
    assert solve_ipv4_ident(SRC, DST, 49152, 4791, body, icrc ^ (1 << bit)) is None


@given(
    body=st.binary(min_size=13, max_size=300),
    ident=st.integers(0, 0xFFFF),
    pos=st.integers(12, 299),
    flip=st.integers(1, 255),
)
def test_payload_corruption_is_detected_or_blamed_on_the_id(
    body: bytes, ident: int, pos: int, flip: int
) -> None:
    icrc = icrc_ipv4(SRC, DST, 49152, 4791, body, ident=ident)
    bad = bytearray(body)
    bad[12 + pos % (len(bad) - 12)] ^= flip  # after the BTH (its byte 4 is masked)
    got = solve_ipv4_ident(SRC, DST, 49152, 4791, bytes(bad), icrc)
    assert got != ident  # the true ID never validates a corrupted payload


def test_too_short_to_hold_a_bth() -> None:
    assert solve_ipv4_ident(SRC, DST, 1, 4791, b"\0" * 4, 0x12345678) is None
