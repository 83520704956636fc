"""Fuzzing: whatever the bytes, the codec parses them or raises WireError, never anything else.

h11's invariant, for every entry point that takes bytes from the network:
``decode``, ``icrc_of_ip_packet``, ``unpack_icrc``, ``FrameDecoder`` and
``parse_syndrome``. Inputs are random bytes and mutations of valid packets (bit
flips, overwrites, truncation, extension). When ``decode`` accepts something,
it must also be a packet we would send: re-encoding gives the same bytes, bar
the bits the decoder ignores.
"""

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmakit.testing.strategies import canonical, packets
from rdmakit.wire import (
    BTH_LEN,
    ICRC_LEN,
    MAX_FRAME,
    FrameDecoder,
    Opcode,
    Packet,
    WireError,
    decode,
    encode,
    frame_header,
    icrc_ipv4,
    icrc_of_ip_packet,
    pack_icrc,
    parse_syndrome,
    unpack_icrc,
)

FUZZ = settings(max_examples=600, deadline=None)


def decodes_or_wire_error(data: bytes | bytearray | memoryview) -> Packet | None:
    try:
        pkt = decode(data)
    except WireError:
        return None
    assert encode(pkt) == canonical(data)
    return pkt


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid byte string, then a few random edits of it."""
    b = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["flip", "set", "truncate", "extend", "insert", "delete"]))
        if edit in ("flip", "set") and b:
            i = draw(st.integers(0, len(b) - 1))
            b[i] = b[i] ^ (1 << draw(st.integers(0, 7))) if edit == "flip" else draw(st.integers(0, 255))
        elif edit == "truncate":
            del b[draw(st.integers(0, len(b))) :]
        elif edit == "extend":
            b += draw(st.binary(min_size=1, max_size=9))
        elif edit == "insert":
            i = draw(st.integers(0, len(b)))
            b[i:i] = draw(st.binary(min_size=1, max_size=5))
        elif b:
            i = draw(st.integers(0, len(b) - 1))
            del b[i : i + draw(st.integers(1, 5))]
    return bytes(b)


ENCODED = packets(max_payload=40).map(encode)
#: Random bytes after a valid RC opcode and TVer 0, to get past the first checks.
PLAUSIBLE = st.builds(
    lambda op, b1, rest: bytes([op, b1 & 0xF0]) + rest,
    st.sampled_from(sorted(Opcode)),
    st.integers(0, 255),
    st.binary(min_size=0, max_size=80),
)


@FUZZ
@given(st.binary(max_size=120))
def test_decode_random_bytes(data: bytes) -> None:
    decodes_or_wire_error(data)


@FUZZ
@given(PLAUSIBLE)
def test_decode_plausible_bytes(data: bytes) -> None:
    decodes_or_wire_error(data)


@FUZZ
@given(mutated(ENCODED))
def test_decode_mutated_packets(data: bytes) -> None:
    decodes_or_wire_error(data)


@FUZZ
@given(mutated(ENCODED), st.sampled_from([bytearray, memoryview]))
def test_decode_mutated_packets_in_other_buffers(data: bytes, kind: type) -> None:
    decodes_or_wire_error(kind(data))


@pytest.mark.parametrize(
    "thing",
    [None, "text", 12, 3.5, [1, 2], object(), array("H", [1, 2])],
    ids=["None", "str", "int", "float", "list", "object", "array-u16"],
)
def test_decode_non_buffers(thing: object) -> None:
    with pytest.raises(WireError):
        decode(thing)  # type: ignore[arg-type]


def test_decode_odd_buffers() -> None:
    wire = encode(Packet(Opcode.SEND_ONLY, 1, 2, payload=b"abcdefgh"))
    released = memoryview(bytearray(wire))
    released.release()
    with pytest.raises(WireError):
        decode(released)
    # Other layouts of the same bytes decode as the bytes they hold.
    assert decode(memoryview(wire).cast("B", (4, len(wire) // 4))) == decode(wire)
    assert decode(memoryview(wire).cast("c")) == decode(wire)  # type: ignore[arg-type]  # any format
    assert decode(memoryview(wire).cast("b")).payload == b"abcdefgh"
    spaced = bytes(x for b in wire for x in (b, 0xEE))
    assert decode(memoryview(spaced)[::2]) == decode(wire)


# --- ICRC entry points ---------------------------------------------------------


@st.composite
def ip_datagrams(draw: st.DrawFn) -> bytes:
    """A valid IPv4 or IPv6 RoCEv2 datagram, ICRC included."""
    body = encode(draw(packets(max_payload=40)))
    n = len(body) + ICRC_LEN
    if draw(st.booleans()):
        src, dst = draw(st.binary(min_size=4, max_size=4)), draw(st.binary(min_size=4, max_size=4))
        ip = bytes([0x45, 0]) + (28 + n).to_bytes(2, "big") + bytes([0, 0, 0x40, 0, 64, 17, 0, 0]) + src + dst
    else:
        src, dst = draw(st.binary(min_size=16, max_size=16)), draw(st.binary(min_size=16, max_size=16))
        ip = bytes([0x60, 0, 0, 0]) + (8 + n).to_bytes(2, "big") + bytes([17, 64]) + src + dst
    udp = bytes([0xC0, 0x00, 0x12, 0xB7]) + (8 + n).to_bytes(2, "big") + b"\0\0"
    datagram = ip + udp + body
    return datagram + pack_icrc(icrc_of_ip_packet(datagram))


def icrc_or_wire_error(data: bytes) -> None:
    try:
        value = icrc_of_ip_packet(data)
    except WireError:
        return
    assert 0 <= value < 1 << 32


@FUZZ
@given(st.binary(max_size=120))
def test_icrc_of_ip_packet_random_bytes(data: bytes) -> None:
    icrc_or_wire_error(data)


@FUZZ
@given(mutated(ip_datagrams().map(lambda d: d[:-ICRC_LEN])))
def test_icrc_of_ip_packet_mutated(data: bytes) -> None:
    icrc_or_wire_error(data)


@given(ip_datagrams(), st.data())
def test_any_single_bit_error_in_a_covered_byte_is_detected(datagram: bytes, data: st.DataObject) -> None:
    # CRC-32 catches every 1-bit error; only the masked fields are exempt.
    v6 = datagram[0] >> 4 == 6
    udp = 40 if v6 else 20
    masked = {1, 2, 3, 7} if v6 else {1, 8, 10, 11}
    masked |= {udp + 6, udp + 7, udp + 8 + 4}
    checked = {0, 4, 5, 6} if v6 else {0, 2, 3, 9}
    covered = [i for i in range(len(datagram)) if i not in masked | checked]
    i = data.draw(st.sampled_from(covered))
    bad = bytearray(datagram)
    bad[i] ^= 1 << data.draw(st.integers(0, 7))
    assert icrc_of_ip_packet(bytes(bad[:-ICRC_LEN])) != unpack_icrc(bytes(bad))


@FUZZ
@given(st.binary(max_size=12))
def test_unpack_icrc_random_bytes(data: bytes) -> None:
    try:
        value = unpack_icrc(data)
    except WireError:
        assert len(data) < ICRC_LEN
        return
    assert pack_icrc(value) == data[-ICRC_LEN:]


@pytest.mark.parametrize("thing", [None, "abcd", 5])
def test_icrc_entry_points_reject_non_buffers(thing: object) -> None:
    with pytest.raises(WireError):
        icrc_of_ip_packet(thing)  # type: ignore[arg-type]
    with pytest.raises(WireError):
        unpack_icrc(thing)  # type: ignore[arg-type]


def test_icrc_ipv4_needs_a_whole_bth() -> None:
    with pytest.raises(WireError):
        icrc_ipv4(b"\0" * 4, b"\0" * 4, 1, 4791, b"\0" * (BTH_LEN - 1))


# --- Framing and syndromes -----------------------------------------------------


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=8))
def test_frame_decoder_random_stream(chunks: list[bytes]) -> None:
    d = FrameDecoder()
    fed = 0
    taken = 0
    try:
        for c in chunks:
            d.feed(c)
            fed += len(c)
            while (body := d.next_frame()) is not None:
                assert BTH_LEN <= len(body) <= MAX_FRAME
                taken += 4 + len(body)
    except WireError:
        return
    assert d.buffered == fed - taken


@FUZZ
@given(mutated(st.lists(ENCODED, min_size=1, max_size=4).map(
    lambda bodies: b"".join(frame_header(len(b)) + b for b in bodies))))  # fmt: skip
def test_frame_decoder_mutated_stream(stream: bytes) -> None:
    d = FrameDecoder()
    d.feed(stream)
    try:
        while (body := d.next_frame()) is not None:
            decodes_or_wire_error(body)
    except WireError:
        return


@FUZZ
@given(st.integers())
def test_parse_syndrome_any_int(s: int) -> None:
    try:
        kind, value = parse_syndrome(s)
    except WireError:
        assert not (0 <= s <= 0xFF and s >> 5 in (0, 1, 3))
        return
    assert 0 <= s <= 0xFF
    assert kind == s >> 5
    assert value == s & 0x1F


@pytest.mark.parametrize("thing", [None, "0x20", 1.5, b"\x20"])
def test_parse_syndrome_non_ints(thing: object) -> None:
    with pytest.raises(WireError):
        parse_syndrome(thing)  # type: ignore[arg-type]
