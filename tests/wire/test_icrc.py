"""The ICRC functions against a plain reference: mask a copy of the whole datagram, CRC it with zlib.

The reference is the recipe of IBTA Vol. 1 Annex A17.3.3 (RoCEv2 ICRC) as
Linux ``rxe_icrc.c`` computes it: 8 bytes of 0xFF, then the IP header, UDP
header and BTH with their variant fields set to all ones, then the rest,
CRC-32 with zlib's own implementation whatever ``rdmakit.wire.CRC32_IMPL`` is.
The recipe itself is checked against public captures in ``test_vectors.py``
(the ConnectX-4 Lx CNP and scapy's ``test/contrib/roce.uts`` vectors).
"""

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmakit.testing.strategies import U8, U16
from rdmakit.wire import (
    BTH_LEN,
    ICRC_LEN,
    IcrcFlow,
    LocalWireError,
    WireError,
    crc32,
    icrc_ipv4,
    icrc_ipv6,
    icrc_of_ip_packet,
    pack_icrc,
    unpack_icrc,
)
from rdmakit.wire import icrc as icrc_mod

ADDR4 = st.binary(min_size=4, max_size=4)
ADDR6 = st.binary(min_size=16, max_size=16)
BODY = st.binary(min_size=BTH_LEN, max_size=300)


def ipv4_datagram(src: bytes, dst: bytes, sport: int, dport: int, body: bytes, ident: int, df: bool,
                  tos: int, ttl: int) -> bytes:  # fmt: skip
    n = len(body) + ICRC_LEN
    ip = struct.pack(
        ">BBHHHBBH4s4s", 0x45, tos, 28 + n, ident, 0x4000 if df else 0, ttl, 17, 0x1234, src, dst
    )
    return ip + struct.pack(">HHHH", sport, dport, 8 + n, 0xBEEF) + body


def ipv6_datagram(src: bytes, dst: bytes, sport: int, dport: int, body: bytes, tc: int, fl: int,
                  hlim: int) -> bytes:  # fmt: skip
    n = len(body) + ICRC_LEN
    ip = struct.pack(">IHBB16s16s", (6 << 28) | (tc << 20) | fl, 8 + n, 17, hlim, src, dst)
    return ip + struct.pack(">HHHH", sport, dport, 8 + n, 0xBEEF) + body


def reference_icrc(datagram: bytes) -> int:
    """rxe's recipe, on a copy of the whole datagram (no ICRC)."""
    b = bytearray(datagram)
    if b[0] >> 4 == 6:
        b[0] |= 0x0F
        b[1:4] = b"\xff\xff\xff"
        b[7] = 0xFF
        u = 40
    else:
        b[1] = 0xFF
        b[8] = 0xFF
        b[10:12] = b"\xff\xff"
        u = 20
    b[u + 6 : u + 8] = b"\xff\xff"
    b[u + 12] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(b))


@st.composite
def splits(draw: st.DrawFn, body: bytes) -> list[bytes | bytearray | memoryview]:
    """``body`` cut into parts, the first holding at least the BTH, as assorted buffer types."""
    cuts = sorted(draw(st.lists(st.integers(BTH_LEN, len(body)), max_size=4)))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    kinds = draw(st.lists(st.sampled_from([bytes, bytearray, memoryview]), min_size=len(parts),
                          max_size=len(parts)))  # fmt: skip
    return [k(p) for k, p in zip(kinds, parts, strict=True)]


@settings(max_examples=300, deadline=None)
@given(ADDR4, ADDR4, U16, U16, BODY, U16, st.booleans(), U8, U8, st.data())
def test_ipv4_matches_the_reference(
    src: bytes, dst: bytes, sport: int, dport: int, body: bytes, ident: int, df: bool, tos: int, ttl: int,
    data: st.DataObject,
) -> None:  # fmt: skip
    datagram = ipv4_datagram(src, dst, sport, dport, body, ident, df, tos, ttl)
    want = reference_icrc(datagram)
    parts = data.draw(splits(body))
    assert icrc_of_ip_packet(datagram) == want
    assert icrc_ipv4(src, dst, sport, dport, *parts, ident=ident, df=df) == want
    flow = IcrcFlow.ipv4(src, dst, sport, dport, ident=ident, df=df)
    assert flow.icrc(*parts) == want
    assert flow.icrc(*parts) == want  # from the cache


@settings(max_examples=300, deadline=None)
@given(ADDR6, ADDR6, U16, U16, BODY, U8, st.integers(0, 2**20 - 1), U8, st.data())
def test_ipv6_matches_the_reference(
    src: bytes, dst: bytes, sport: int, dport: int, body: bytes, tc: int, fl: int, hlim: int,
    data: st.DataObject,
) -> None:  # fmt: skip
    datagram = ipv6_datagram(src, dst, sport, dport, body, tc, fl, hlim)
    want = reference_icrc(datagram)
    parts = data.draw(splits(body))
    assert icrc_of_ip_packet(datagram) == want
    assert icrc_ipv6(src, dst, sport, dport, *parts) == want
    assert IcrcFlow.ipv6(src, dst, sport, dport).icrc(*parts) == want


@given(BODY, st.sampled_from(["fecn", "becn", "resv6", "all"]))
def test_bth_byte_4_is_masked(body: bytes, what: str) -> None:
    b = bytearray(body)
    b[4] ^= {"fecn": 0x80, "becn": 0x40, "resv6": 0x15, "all": 0xFF}[what]
    args = (b"\1\2\3\4", b"\5\6\7\x08", 1, 4791)
    assert icrc_ipv4(*args, bytes(b)) == icrc_ipv4(*args, body)
    assert icrc_ipv4(*args, bytes(b[:12]), bytes(b[12:])) == icrc_ipv4(*args, body)


def test_pack_is_little_endian() -> None:
    assert pack_icrc(0x2A00FD82) == bytes.fromhex("82fd002a")
    assert unpack_icrc(b"xx" + bytes.fromhex("82fd002a")) == 0x2A00FD82


def test_flow_cache_is_bounded_and_stays_right() -> None:
    src, dst = b"\1\2\3\4", b"\5\6\7\x08"
    flow = IcrcFlow.ipv4(src, dst, 7, 4791)
    seen = 0
    for n in range(BTH_LEN, BTH_LEN + 3 * icrc_mod._FLOW_CACHE_MAX, 7):
        body = bytes(range(256)) * (n // 256) + bytes(n % 256)
        assert flow.icrc(body) == icrc_ipv4(src, dst, 7, 4791, body)
        for k in (1, 63, 0xFFFF):
            assert flow.icrc_seg(k, body) == icrc_ipv4(src, dst, 7, 4791, body, ident=k)
        seen += 4
        assert len(flow.states) <= icrc_mod._FLOW_CACHE_MAX
    assert seen > icrc_mod._FLOW_CACHE_MAX


def test_flow_segments_carry_consecutive_ids() -> None:
    """GSO segment k of a flow whose first ID is ``ident`` carries ID ``ident + k`` (mod 2^16)."""
    src, dst = b"\1\2\3\4", b"\5\6\7\x08"
    body = bytes(range(100))
    flow = IcrcFlow.ipv4(src, dst, 7, 4791, ident=0xFFFE)
    for k in range(4):
        want = icrc_ipv4(src, dst, 7, 4791, body, ident=(0xFFFE + k) & 0xFFFF)
        assert flow.icrc_seg(k, body) == want
        assert crc32(body[12:], crc32(body[:4] + b"\xff" + body[5:12], flow.state(len(body) + 4, k))) == want
    v6 = IcrcFlow.ipv6(bytes(16), bytes(range(16)), 7, 4791)
    assert v6.icrc_seg(5, body) == v6.icrc(body) == icrc_ipv6(bytes(16), bytes(range(16)), 7, 4791, body)
    with pytest.raises(LocalWireError):
        flow.icrc_seg(1 << 16, body)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: icrc_ipv4(b"\0" * 3, b"\0" * 4, 1, 2, bytes(12)), LocalWireError),
        (lambda: icrc_ipv4(b"\0" * 4, b"\0" * 16, 1, 2, bytes(12)), LocalWireError),
        (lambda: icrc_ipv6(b"\0" * 4, b"\0" * 4, 1, 2, bytes(12)), LocalWireError),
        (lambda: icrc_ipv4(b"\0" * 4, b"\0" * 4, 1 << 16, 2, bytes(12)), LocalWireError),
        (lambda: icrc_ipv4(b"\0" * 4, b"\0" * 4, 1, 2, bytes(12), ident=1 << 16), LocalWireError),
        (lambda: icrc_ipv4(b"\0" * 4, b"\0" * 4, 1, 2), LocalWireError),
        (lambda: icrc_ipv4(b"\0" * 4, b"\0" * 4, 1, 2, "x" * 12), LocalWireError),  # type: ignore[arg-type]
        (lambda: icrc_ipv4(b"\0" * 4, b"\0" * 4, 1, 2, bytes(12), "abc"), LocalWireError),  # type: ignore[arg-type]
        (lambda: icrc_ipv4(b"\0" * 4, b"\0" * 4, 1, 2, bytes(70000)), LocalWireError),
        (lambda: icrc_ipv6(b"\0" * 16, b"\0" * 16, 1, 2, bytes(11)), WireError),
        (lambda: icrc_ipv4(b"\0" * 4, b"\0" * 4, 1, 2, bytes(4), bytes(8)), WireError),
        (lambda: IcrcFlow.ipv4(b"\0" * 4, b"\0" * 5, 1, 2), LocalWireError),
        (lambda: IcrcFlow.ipv6(b"\0" * 16, b"\0" * 16, -1, 2), LocalWireError),
        (lambda: IcrcFlow.ipv4(b"\0" * 4, b"\0" * 4, 1, 2).icrc(bytes(70000)), LocalWireError),
        (lambda: IcrcFlow.ipv4(b"\0" * 4, b"\0" * 4, 1, 2).icrc(), LocalWireError),
        (lambda: IcrcFlow.ipv4(b"\0" * 4, b"\0" * 4, 1, 2).icrc(bytes(12), 5), LocalWireError),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments(call: object, error: type[Exception]) -> None:
    with pytest.raises(error) as e:
        call()  # type: ignore[operator]
    assert type(e.value) is error
