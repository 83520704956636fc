"""The packet codec: a table of (Packet, bytes) checked both ways, and round-trip properties.

The bytes in the table are written by hand from the IBTA Vol. 1 §9.2-§9.3
layouts (the BTH and the extension headers, as Linux ``include/rdma/ib_pack.h``
and ``rxe_hdr.h`` lay them out), one
field per group, so a wrong offset, width, order or bit in the codec shows up
as a byte that differs.
"""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmakit.testing.strategies import OPCODES, U8, canonical, packets
from rdmakit.wire import (
    AETH,
    BTH_LEN,
    OPCODE_INFO,
    RETH,
    AckKind,
    AtomicETH,
    Kind,
    LocalWireError,
    NakCode,
    Opcode,
    Packet,
    Position,
    WireError,
    ack_syndrome,
    decode,
    encode,
    encode_headers,
    nak_syndrome,
    pad_bytes,
    pad_len,
    parse_syndrome,
    rnr_syndrome,
)

Op = Opcode


def h(text: str) -> bytes:
    """Hex with spaces and ``|`` between header groups, for readable vectors."""
    return bytes.fromhex(text.replace("|", " "))


#: (id, Packet, wire bytes). Each BTH is: opcode | SE.MigReq.PadCnt.TVer | P_Key |
#: FECN.BECN.resv6 | DestQP (24) | AckReq.resv7 | PSN (24).
CASES: list[tuple[str, Packet, bytes]] = [
    (
        # SE (0x80) and PadCnt 3 (0x30) in byte 1; AckReq in byte 8; 24-bit QPN and
        # PSN; 5 payload bytes then 3 zero pad bytes.
        "send-only-se-ackreq-pad3",
        Packet(Op.SEND_ONLY, 0x123456, 0xABCDEF, ackreq=True, se=True, payload=b"hello"),
        h("04 | b0 | ffff | 00 | 123456 | 80 | abcdef | 68656c6c6f | 000000"),
    ),
    (
        # MigReq (0x40); a non-default P_Key; RETH = VA u64, R_Key u32, DMA length u32.
        "write-first-reth-migreq-pkey",
        Packet(Op.RDMA_WRITE_FIRST, 1, 0, migreq=True, pkey=0x8001,
               reth=RETH(0x0011223344556677, 0x89ABCDEF, 0x00010000), payload=h("deadbeef")),
        h("06 | 40 | 8001 | 00 | 000001 | 00 | 000000 | 0011223344556677 89abcdef 00010000 | deadbeef"),
    ),
    (
        # FECN (0x80) and BECN (0x40) in byte 4; all-ones QPN and PSN; AETH =
        # syndrome u8 (NAK 011, code 1: invalid request) then MSN u24.
        "ack-nak-fecn-becn-max-qpn-psn",
        Packet(Op.ACKNOWLEDGE, 0xFFFFFF, 0xFFFFFF, fecn=True, becn=True,
               aeth=AETH(nak_syndrome(NakCode.INVALID_REQUEST), 0x00BEEF)),
        h("11 | 00 | ffff | c0 | ffffff | 00 | ffffff | 61 00beef"),
    ),
    (
        # RNR NAK (001) with timer code 12.
        "ack-rnr-nak",
        Packet(Op.ACKNOWLEDGE, 0x10, 0x20, aeth=AETH(rnr_syndrome(12), 3)),
        h("11 | 00 | ffff | 00 | 000010 | 00 | 000020 | 2c 000003"),
    ),
    (
        # AtomicETH: VA, R_Key, then Swap, then Compare (swap precedes compare).
        "compare-swap",
        Packet(Op.COMPARE_SWAP, 0x000ABC, 0x10, ackreq=True,
               atomic_eth=AtomicETH(0x00007F0000001000, 0x1234, 0x1111111111111111, 0x2222222222222222)),
        h("13 | 00 | ffff | 00 | 000abc | 80 | 000010 | 00007f0000001000 00001234 "
          "| 1111111111111111 | 2222222222222222"),
    ),
    (
        # FETCH_ADD: the add value sits where the swap value does.
        "fetch-add",
        Packet(Op.FETCH_ADD, 7, 8, ackreq=True, atomic_eth=AtomicETH(0x2000, 0xA, 5, 0)),
        h("14 | 00 | ffff | 00 | 000007 | 80 | 000008 | 0000000000002000 0000000a "
          "| 0000000000000005 | 0000000000000000"),
    ),
    (
        # AETH (ACK, credits 0x1F) then AtomicAckETH (original remote data u64).
        "atomic-ack",
        Packet(Op.ATOMIC_ACKNOWLEDGE, 2, 0x11, aeth=AETH(ack_syndrome(), 7), atomic_ack=0xFEDCBA9876543210),
        h("12 | 00 | ffff | 00 | 000002 | 00 | 000011 | 1f 000007 | fedcba9876543210"),
    ),
    (
        # ImmDt: 4 bytes as given; PadCnt 2 (0x20).
        "send-only-imm-pad2",
        Packet(Op.SEND_ONLY_WITH_IMMEDIATE, 0x10, 1, imm=0x12345678, payload=b"ab"),
        h("05 | 20 | ffff | 00 | 000010 | 00 | 000001 | 12345678 | 6162 0000"),
    ),
    (
        # IETH: the R_Key to invalidate; PadCnt 1 (0x10).
        "send-last-inv-pad1",
        Packet(Op.SEND_LAST_WITH_INVALIDATE, 0x10, 2, ackreq=True, ieth=0xCAFEF00D, payload=b"xyz"),
        h("16 | 10 | ffff | 00 | 000010 | 80 | 000002 | cafef00d | 78797a 00"),
    ),
    (
        "send-only-inv",
        Packet(Op.SEND_ONLY_WITH_INVALIDATE, 0x10, 3, ieth=1, payload=b"wxyz"),
        h("17 | 00 | ffff | 00 | 000010 | 00 | 000003 | 00000001 | 7778797a"),
    ),
    (
        # RETH then ImmDt, then payload and pad.
        "write-only-imm",
        Packet(Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE, 3, 4, ackreq=True, reth=RETH(0x1000, 0x42, 1),
               imm=0xDEADBEEF, payload=b"\x01"),
        h("0b | 30 | ffff | 00 | 000003 | 80 | 000004 | 0000000000001000 00000042 00000001 "
          "| deadbeef | 01 000000"),
    ),
    (
        "write-last-imm",
        Packet(Op.RDMA_WRITE_LAST_WITH_IMMEDIATE, 3, 5, imm=0, payload=b"1234"),
        h("09 | 00 | ffff | 00 | 000003 | 00 | 000005 | 00000000 | 31323334"),
    ),
    (
        "send-last-imm",
        Packet(Op.SEND_LAST_WITH_IMMEDIATE, 3, 6, imm=0xFFFFFFFF, payload=b""),
        h("03 | 00 | ffff | 00 | 000003 | 00 | 000006 | ffffffff"),
    ),
    (
        # READ request: RETH only, no payload; all-ones VA and R_Key, 2^31 length.
        "read-request",
        Packet(Op.RDMA_READ_REQUEST, 5, 6, ackreq=True, reth=RETH(2**64 - 1, 2**32 - 1, 2**31)),
        h("0c | 00 | ffff | 00 | 000005 | 80 | 000006 | ffffffffffffffff ffffffff 80000000"),
    ),
    (
        # READ response first: AETH then payload.
        "read-response-first",
        Packet(Op.RDMA_READ_RESPONSE_FIRST, 9, 0x100, aeth=AETH(0x1F, 0x123456),
               payload=h("0102030405060708")),
        h("0d | 00 | ffff | 00 | 000009 | 00 | 000100 | 1f 123456 | 0102030405060708"),
    ),
    (
        # READ response middle: no AETH (IBTA §9.2 table 35).
        "read-response-middle-pad3",
        Packet(Op.RDMA_READ_RESPONSE_MIDDLE, 9, 0x101, payload=b"\xff"),
        h("0e | 30 | ffff | 00 | 000009 | 00 | 000101 | ff 000000"),
    ),
    (
        "read-response-last",
        Packet(Op.RDMA_READ_RESPONSE_LAST, 9, 0x102, aeth=AETH(0x00, 1), payload=b"z"),
        h("0f | 30 | ffff | 00 | 000009 | 00 | 000102 | 00 000001 | 7a 000000"),
    ),
    (
        "read-response-only",
        Packet(Op.RDMA_READ_RESPONSE_ONLY, 9, 0x103, aeth=AETH(0x1F, 0), payload=b""),
        h("10 | 00 | ffff | 00 | 000009 | 00 | 000103 | 1f 000000"),
    ),
    (
        "send-first",
        Packet(Op.SEND_FIRST, 0x800000, 0x800000, payload=b"abcd"),
        h("00 | 00 | ffff | 00 | 800000 | 00 | 800000 | 61626364"),
    ),
    ("send-middle", Packet(Op.SEND_MIDDLE, 1, 2, payload=b"abcd"),
     h("01 | 00 | ffff | 00 | 000001 | 00 | 000002 | 61626364")),
    ("send-last", Packet(Op.SEND_LAST, 1, 3, ackreq=True, payload=b"abcde"),
     h("02 | 30 | ffff | 00 | 000001 | 80 | 000003 | 6162636465 000000")),
    ("write-middle", Packet(Op.RDMA_WRITE_MIDDLE, 1, 4, payload=b"abcd"),
     h("07 | 00 | ffff | 00 | 000001 | 00 | 000004 | 61626364")),
    ("write-last", Packet(Op.RDMA_WRITE_LAST, 1, 5, payload=b"abcdef"),
     h("08 | 20 | ffff | 00 | 000001 | 00 | 000005 | 616263646566 0000")),
    (
        # P_Key 0x7FFF (limited member of the default partition).
        "write-only-pkey-7fff",
        Packet(Op.RDMA_WRITE_ONLY, 1, 6, pkey=0x7FFF, reth=RETH(0, 0, 0), payload=b""),
        h("0a | 00 | 7fff | 00 | 000001 | 00 | 000006 | 0000000000000000 00000000 00000000"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("pkt", "wire"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_encode_matches_hand_computed_bytes(pkt: Packet, wire: bytes) -> None:
    assert encode(pkt) == wire
    assert encode_headers(pkt) == wire[: BTH_LEN + OPCODE_INFO[pkt.opcode].ext_len]


@pytest.mark.parametrize(("pkt", "wire"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decode_matches_hand_computed_packet(pkt: Packet, wire: bytes) -> None:
    got = decode(wire)
    assert got == pkt
    assert bytes(got.payload) == bytes(pkt.payload)
    assert type(got.opcode) is Opcode


def test_table_covers_every_opcode() -> None:
    assert {c[1].opcode for c in CASES} == set(Opcode)


#: The header set of each RC opcode, transcribed independently from IBTA §9.2
#: table 35 / rxe_opcode.c (reference §1) to check OPCODE_INFO against.
HEADERS = {
    Op.SEND_FIRST: "P", Op.SEND_MIDDLE: "P", Op.SEND_LAST: "P", Op.SEND_LAST_WITH_IMMEDIATE: "I P",
    Op.SEND_ONLY: "P", Op.SEND_ONLY_WITH_IMMEDIATE: "I P",
    Op.RDMA_WRITE_FIRST: "R P", Op.RDMA_WRITE_MIDDLE: "P", Op.RDMA_WRITE_LAST: "P",
    Op.RDMA_WRITE_LAST_WITH_IMMEDIATE: "I P", Op.RDMA_WRITE_ONLY: "R P",
    Op.RDMA_WRITE_ONLY_WITH_IMMEDIATE: "R I P", Op.RDMA_READ_REQUEST: "R",
    Op.RDMA_READ_RESPONSE_FIRST: "A P", Op.RDMA_READ_RESPONSE_MIDDLE: "P",
    Op.RDMA_READ_RESPONSE_LAST: "A P", Op.RDMA_READ_RESPONSE_ONLY: "A P", Op.ACKNOWLEDGE: "A",
    Op.ATOMIC_ACKNOWLEDGE: "A K", Op.COMPARE_SWAP: "T", Op.FETCH_ADD: "T",
    Op.SEND_LAST_WITH_INVALIDATE: "V P", Op.SEND_ONLY_WITH_INVALIDATE: "V P",
}  # fmt: skip
_SIZES = {"R": 16, "A": 4, "T": 28, "K": 8, "I": 4, "V": 4, "P": 0}


@pytest.mark.parametrize("op", sorted(Opcode), ids=lambda o: o.name)
def test_opcode_header_sets(op: Opcode) -> None:
    info = OPCODE_INFO[op]
    want = set(HEADERS[op].split())
    got = {
        k for k, on in (("R", info.reth), ("A", info.aeth), ("T", info.atomic_eth),
                        ("K", info.atomic_ack_eth), ("I", info.imm), ("V", info.ieth),
                        ("P", info.payload)) if on
    }  # fmt: skip
    assert got == want
    assert info.ext_len == sum(_SIZES[k] for k in want)
    assert info.opcode is op
    assert info.is_request == (info.kind in (Kind.SEND, Kind.WRITE, Kind.READ_REQUEST, Kind.ATOMIC))
    single = info.kind in (Kind.ACK, Kind.ATOMIC_ACK, Kind.ATOMIC, Kind.READ_REQUEST)
    assert info.starts_message == ("FIRST" in op.name or "ONLY" in op.name or single)
    assert info.ends_message == ("LAST" in op.name or "ONLY" in op.name or single)
    assert info.position in Position
    # rxe RXE_RWR_MASK: SEND FIRST/ONLY* and WRITE *_WITH_IMMEDIATE take a receive WQE.
    assert info.consumes_rwqe == (
        (info.kind is Kind.SEND and info.starts_message) or (info.kind is Kind.WRITE and info.imm)
    )


# --- Round-trip properties -----------------------------------------------------


@given(packets())
def test_encode_then_decode_is_identity(pkt: Packet) -> None:
    data = encode(pkt)
    assert len(data) % 4 == 0
    assert data[1] >> 4 & 3 == pad_len(len(pkt.payload))
    got = decode(data)
    assert got == pkt
    assert encode(got) == data


@given(packets(), st.sampled_from([bytes, bytearray, memoryview]))
def test_decode_takes_any_buffer_and_is_zero_copy(pkt: Packet, kind: type) -> None:
    data = kind(encode(pkt))
    got = decode(data)
    assert got == pkt
    assert isinstance(got.payload, memoryview)
    if len(got.payload) and isinstance(data, bytearray):
        data[BTH_LEN + OPCODE_INFO[pkt.opcode].ext_len] ^= 0xFF  # the payload's first byte
        assert got.payload[0] == (pkt.payload[0] ^ 0xFF)


@given(packets(), st.data())
def test_decode_then_encode_gives_the_canonical_bytes(pkt: Packet, data: st.DataObject) -> None:
    # Dirty every bit the decoder ignores (reserved BTH bits, pad bytes): the
    # decoded packet is the same, and encodes to the clean bytes.
    wire = bytearray(encode(pkt))
    wire[4] |= data.draw(st.integers(0, 0x3F), "resv6")
    wire[8] |= data.draw(st.integers(0, 0x7F), "resv7")
    pad = pad_len(len(pkt.payload))
    if pad:
        wire[-pad:] = data.draw(st.binary(min_size=pad, max_size=pad), "pad")
    got = decode(bytes(wire))
    assert got == pkt
    assert encode(got) == canonical(wire) == encode(pkt)


@given(packets(opcodes=st.sampled_from([o for o in Opcode if OPCODE_INFO[o].payload]), max_payload=4200))
def test_large_payloads(pkt: Packet) -> None:
    assert decode(encode(pkt)) == pkt


def test_pad_helpers() -> None:
    assert [pad_len(n) for n in range(8)] == [0, 3, 2, 1, 0, 3, 2, 1]
    assert [pad_bytes(n) for n in range(4)] == [b"", b"\0\0\0", b"\0\0", b"\0"]


def test_encode_takes_memoryview_payload_without_changing_it() -> None:
    buf = bytearray(b"0123456789")
    pkt = Packet(Op.SEND_ONLY, 1, 2, payload=memoryview(buf)[2:7])
    assert encode(pkt) == h("04 30 ffff 00 000001 00 000002") + b"23456" + b"\0\0\0"
    assert buf == b"0123456789"


# --- AETH syndromes ------------------------------------------------------------


def test_syndrome_builders() -> None:
    assert ack_syndrome() == 0x1F
    assert ack_syndrome(3) == 0x03
    assert rnr_syndrome(0) == 0x20
    assert rnr_syndrome(31) == 0x3F
    assert [nak_syndrome(c) for c in NakCode] == [0x60, 0x61, 0x62, 0x63, 0x64]


@given(U8)
def test_parse_syndrome(s: int) -> None:
    kinds = {0b000: AckKind.ACK, 0b001: AckKind.RNR_NAK, 0b011: AckKind.NAK}
    if s >> 5 in kinds:
        kind, value = parse_syndrome(s)
        assert kind is kinds[s >> 5]
        assert value == s & 0x1F
    else:
        with pytest.raises(WireError, match="reserved"):
            parse_syndrome(s)


@pytest.mark.parametrize("s", [-1, 0x100, 0x11F, 2**40, -(2**40)])
def test_parse_syndrome_rejects_non_u8(s: int) -> None:
    with pytest.raises(WireError):
        parse_syndrome(s)


# --- What the decoder refuses (the peer's fault) --------------------------------

_ACK = h("11 00 ffff 00 000001 00 000002 1f000003")
_SEND = h("04 00 ffff 00 000001 00 000002 61626364")

REJECT: list[tuple[str, bytes, str]] = [
    ("empty", b"", "shorter than a BTH"),
    ("11 bytes", _SEND[:11], "shorter than a BTH"),
    ("reserved opcode 0x15", b"\x15" + _SEND[1:], "opcode 0x15"),
    ("UC SEND_ONLY", b"\x24" + _SEND[1:], "opcode 0x24"),
    ("UD SEND_ONLY", b"\x64" + _SEND[1:], "opcode 0x64"),
    ("CNP", b"\x81" + _SEND[1:], "opcode 0x81"),
    ("FLUSH (newer kernels)", b"\x1c" + _SEND[1:], "opcode 0x1c"),
    ("TVer 1", _SEND[:1] + b"\x01" + _SEND[2:], "version 1"),
    ("not a word multiple", _SEND + b"e", "multiple of 4"),
    ("ACK truncated AETH", _ACK[:12], "cannot hold"),
    ("ACK with payload", _ACK + b"abcd", "carries no payload"),
    ("ACK with pad count", _ACK[:1] + b"\x10" + _ACK[2:], "cannot hold"),
    ("ACK with pad count and pad", _ACK[:1] + b"\x10" + _ACK[2:] + b"\0\0\0\0", "carries no payload"),
    ("pad longer than payload", _SEND[:1] + b"\x30" + _SEND[2:12], "cannot hold"),
    ("READ request with payload", h("0c 00 ffff 00 000001 00 000002") + bytes(16) + b"abcd", "no payload"),
    ("atomic truncated", h("13 00 ffff 00 000001 00 000002") + bytes(24), "cannot hold"),
    ("atomic with payload", h("13 00 ffff 00 000001 00 000002") + bytes(32), "no payload"),
    ("atomic ack truncated", h("12 00 ffff 00 000001 00 000002") + bytes(8), "cannot hold"),
    ("write first truncated RETH", h("06 00 ffff 00 000001 00 000002") + bytes(12), "cannot hold"),
    ("imm truncated by pad", h("05 10 ffff 00 000001 00 000002 00000000"), "cannot hold"),
]


@pytest.mark.parametrize(("data", "why"), [c[1:] for c in REJECT], ids=[c[0] for c in REJECT])
def test_decode_rejects(data: bytes, why: str) -> None:
    with pytest.raises(WireError, match=re.escape(why)) as e:
        decode(data)
    assert type(e.value) is WireError  # the peer's fault, not a LocalWireError


def test_decode_accepts_a_zero_length_send() -> None:
    pkt = decode(h("04 00 ffff 00 000001 00 000002"))
    assert pkt.opcode is Op.SEND_ONLY
    assert bytes(pkt.payload) == b""


# --- What the encoder refuses (the caller's fault) ------------------------------

_OK = Packet(Op.SEND_ONLY, 1, 2)
ENCODE_REJECT: list[tuple[str, Packet, str]] = [
    ("reserved opcode", _OK._replace(opcode=0x15), "not an RC opcode"),  # type: ignore[arg-type]
    ("UC opcode", _OK._replace(opcode=0x24), "not an RC opcode"),  # type: ignore[arg-type]
    ("qpn 2^24", _OK._replace(dest_qp=1 << 24), "dest_qp"),
    ("qpn negative", _OK._replace(dest_qp=-1), "dest_qp"),
    ("psn 2^24", _OK._replace(psn=1 << 24), "psn"),
    ("psn negative", _OK._replace(psn=-1), "psn"),
    ("pkey 2^16", _OK._replace(pkey=1 << 16), "pkey"),
    ("payload on ACK", Packet(Op.ACKNOWLEDGE, 1, 2, aeth=AETH(0, 0), payload=b"x"), "carries no payload"),
    ("payload on READ", Packet(Op.RDMA_READ_REQUEST, 1, 2, reth=RETH(0, 0, 0), payload=b"x"), "no payload"),
    ("payload on atomic", Packet(Op.FETCH_ADD, 1, 2, atomic_eth=AtomicETH(0, 0, 0, 0), payload=b"x"),
     "no payload"),
    ("missing RETH", Packet(Op.RDMA_WRITE_FIRST, 1, 2), "lacks its RETH"),
    ("missing AETH", Packet(Op.ACKNOWLEDGE, 1, 2), "lacks its AETH"),
    ("missing AtomicETH", Packet(Op.COMPARE_SWAP, 1, 2), "lacks its AtomicETH"),
    ("missing AtomicAckETH", Packet(Op.ATOMIC_ACKNOWLEDGE, 1, 2, aeth=AETH(0, 0)), "lacks its AtomicAckETH"),
    ("missing ImmDt", Packet(Op.SEND_ONLY_WITH_IMMEDIATE, 1, 2), "lacks its ImmDt"),
    ("missing IETH", Packet(Op.SEND_ONLY_WITH_INVALIDATE, 1, 2), "lacks its IETH"),
    ("RETH on WRITE_MIDDLE", Packet(Op.RDMA_WRITE_MIDDLE, 1, 2, reth=RETH(0, 0, 0)), "carries no RETH"),
    ("ImmDt on SEND_LAST", Packet(Op.SEND_LAST, 1, 2, imm=5), "carries no ImmDt"),
    ("AETH on READ middle", Packet(Op.RDMA_READ_RESPONSE_MIDDLE, 1, 2, aeth=AETH(0, 0)), "carries no AETH"),
    ("IETH on SEND_ONLY_IMM", Packet(Op.SEND_ONLY_WITH_IMMEDIATE, 1, 2, imm=1, ieth=1), "carries no IETH"),
    ("AtomicAck on ACK", Packet(Op.ACKNOWLEDGE, 1, 2, aeth=AETH(0, 0), atomic_ack=1), "carries no AtomicAck"),
    ("AtomicETH on READ", Packet(Op.RDMA_READ_REQUEST, 1, 2, reth=RETH(0, 0, 0),
                                 atomic_eth=AtomicETH(0, 0, 0, 0)), "carries no AtomicETH"),
    ("MSN 2^24", Packet(Op.ACKNOWLEDGE, 1, 2, aeth=AETH(0, 1 << 24)), "msn"),
    ("syndrome 256", Packet(Op.ACKNOWLEDGE, 1, 2, aeth=AETH(256, 0)), "syndrome"),
    ("VA 2^64", Packet(Op.RDMA_READ_REQUEST, 1, 2, reth=RETH(1 << 64, 0, 0)), "va"),
    ("DMA length 2^32", Packet(Op.RDMA_READ_REQUEST, 1, 2, reth=RETH(0, 0, 1 << 32)), "dma_len"),
    ("compare 2^64", Packet(Op.COMPARE_SWAP, 1, 2, atomic_eth=AtomicETH(0, 0, 0, 1 << 64)), "compare"),
    ("imm 2^32", Packet(Op.SEND_ONLY_WITH_IMMEDIATE, 1, 2, imm=1 << 32), "imm"),
    ("imm negative", Packet(Op.SEND_ONLY_WITH_IMMEDIATE, 1, 2, imm=-1), "imm"),
    ("atomic ack 2^64", Packet(Op.ATOMIC_ACKNOWLEDGE, 1, 2, aeth=AETH(0, 0), atomic_ack=1 << 64),
     "atomic_ack"),
    ("RETH of 2", Packet(Op.RDMA_READ_REQUEST, 1, 2, reth=(0, 0)), "RETH"),  # type: ignore[arg-type]
    ("payload not a buffer", _OK._replace(payload=5), "payload"),  # type: ignore[arg-type]
    ("payload of u32 items", _OK._replace(payload=memoryview(b"abcd").cast("I")), "payload"),
]  # fmt: skip


@pytest.mark.parametrize(("pkt", "why"), [c[1:] for c in ENCODE_REJECT], ids=[c[0] for c in ENCODE_REJECT])
def test_encode_rejects(pkt: Packet, why: str) -> None:
    with pytest.raises(LocalWireError, match=re.escape(why)):
        encode_headers(pkt)
    with pytest.raises(LocalWireError):
        encode(pkt)


@pytest.mark.parametrize("thing", [None, 5, (1, 2, 3), "SEND_ONLY"])
def test_encode_rejects_what_is_not_a_packet(thing: object) -> None:
    with pytest.raises(LocalWireError, match="not a Packet"):
        encode_headers(thing)  # type: ignore[arg-type]


def test_encode_takes_a_plain_tuple_and_int_opcode() -> None:
    assert encode(tuple(CASES[0][1])) == CASES[0][2]  # type: ignore[arg-type]
    assert encode(CASES[0][1]._replace(opcode=4)) == CASES[0][2]  # type: ignore[arg-type]
    bad = tuple(CASES[0][1]._replace(psn=1 << 24))
    with pytest.raises(LocalWireError, match="psn"):
        encode(bad)  # type: ignore[arg-type]


def test_encode_rejects_a_str_payload() -> None:
    # encode_headers only needs the payload's length; encode needs its bytes.
    with pytest.raises(LocalWireError, match="payload"):
        encode(_OK._replace(payload="abcd"))  # type: ignore[arg-type]


@given(packets(), st.data())
def test_encode_rejects_any_extra_header(pkt: Packet, data: st.DataObject) -> None:
    info = OPCODE_INFO[pkt.opcode]
    extra = {
        "reth": (info.reth, RETH(1, 2, 3)), "aeth": (info.aeth, AETH(0, 1)),
        "atomic_eth": (info.atomic_eth, AtomicETH(1, 2, 3, 4)), "atomic_ack": (info.atomic_ack_eth, 1),
        "imm": (info.imm, 1), "ieth": (info.ieth, 1),
    }  # fmt: skip
    field = data.draw(st.sampled_from(sorted(k for k, (on, _) in extra.items() if not on)))
    with pytest.raises(LocalWireError, match="carries no"):
        encode(Packet(**{**pkt._asdict(), field: extra[field][1]}))


@given(OPCODES)
def test_truthy_flags_are_single_bits(op: Opcode) -> None:
    # Flags given as any truthy value set exactly their bit, never a neighbour's.
    pkt = next(p for _, p, _ in CASES if p.opcode is op)
    wire = encode(pkt._replace(fecn=0, becn=2, se=0, migreq=7, ackreq=0))  # type: ignore[arg-type]
    assert wire[4] & 0xC0 == 0x40
    assert wire[1] & 0xC0 == 0x40
    assert wire[8] & 0x80 == 0
