"""Both segment codecs (``fastpath.PYTHON``, ``NATIVE``): single packets against ``encode``.

One suite, run over each implementation of ``rdmakit.transport.codec``. What
``send_packet`` puts on the wire must be ``encode`` plus the ICRC
``icrc_ipv4`` gives it, for every valid packet; what ``check_decode`` returns
must be ``decode`` of a segment whose ICRC matches. Whatever the Python codec
refuses, the native one hands back to it (-1, 1), and a bad ICRC is 0: the
device then takes the Python path, which says what is wrong.
"""

import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmakit.testing.strategies import packets
from rdmakit.transport import fastpath
from rdmakit.transport.codec import SegmentCodec
from rdmakit.wire import (
    AETH,
    RETH,
    IcrcFlow,
    LocalWireError,
    Opcode,
    Packet,
    WireError,
    decode,
    encode,
    encode_headers,
    icrc_ipv4,
    pack_icrc,
)
from tests.transport.sockets import udp_sink

native_only = pytest.mark.skipif(fastpath.native is None, reason=f"native data plane: {fastpath.describe()}")
native: Any = fastpath.native


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(fastpath.PYTHON, id="python"),
        pytest.param(fastpath.NATIVE, id="native", marks=native_only),
    ],
)
def codec(request: pytest.FixtureRequest) -> SegmentCodec:
    c: SegmentCodec = request.param
    return c


class _Pair:
    """A sending socket and a sink on two loopback addresses, with the flow's ICRC states."""

    def __init__(self, new_ip: Callable[[], str], codec: SegmentCodec) -> None:
        self.codec = codec
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tx.bind((new_ip(), 0))
        self.tx.setblocking(False)
        self.rx = udp_sink(new_ip())
        (sip, self.sport), (dip, self.dport) = self.tx.getsockname(), self.rx.getsockname()
        self.src, self.dst = socket.inet_aton(sip), socket.inet_aton(dip)
        self.addr = (dip, self.dport)
        self.flow = IcrcFlow.ipv4(self.src, self.dst, self.sport, self.dport)

    def send(self, pkt: Any) -> int:
        return int(self.codec.send_packet(self.tx, self.addr, pkt, self.flow.states, self.flow))

    def wire(self, pkt: Packet) -> bytes:
        body = encode(pkt)
        return body + pack_icrc(icrc_ipv4(self.src, self.dst, self.sport, self.dport, body, ident=0))

    def nothing_arrived(self) -> bool:
        self.rx.settimeout(0.05)
        try:
            self.rx.recv(65536)
        except TimeoutError:
            return True
        finally:
            self.rx.settimeout(5.0)
        return False

    def close(self) -> None:
        self.tx.close()
        self.rx.close()


@pytest.fixture
def pair(new_ip: Callable[[], str], codec: SegmentCodec) -> Iterator[_Pair]:
    p = _Pair(new_ip, codec)
    yield p
    p.close()


_SETTINGS = settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_SETTINGS
@given(pkt=packets(max_payload=300))
def test_send_packet_sends_encode_plus_its_icrc(pair: _Pair, pkt: Packet) -> None:
    assert pair.send(pkt) == 0
    assert pair.rx.recv(65536) == pair.wire(pkt)


def test_send_packet_takes_every_payload_buffer_and_the_states_it_lacks(pair: _Pair) -> None:
    base = Packet(Opcode.SEND_ONLY, 0x123456, 0xFFFFFF, ackreq=True, payload=b"")
    for payload in (
        b"",
        b"x",
        bytearray(b"abcde"),
        memoryview(b"0123456789")[3:9],
        memoryview(bytearray(4097)),
    ):
        pkt = base._replace(payload=payload)
        pair.flow.states.clear()
        assert pair.send(pkt) == 0
        assert pair.rx.recv(65536) == pair.wire(pkt)
        assert pair.flow.states  # the missing state was computed by the flow (and cached there)


BAD: list[tuple[str, Any]] = [
    ("qpn over 24 bits", Packet(Opcode.SEND_ONLY, 1 << 24, 0)),
    ("negative PSN", Packet(Opcode.SEND_ONLY, 1, -1)),
    ("P_Key over 16 bits", Packet(Opcode.SEND_ONLY, 1, 0, pkey=0x10000)),
    ("missing RETH", Packet(Opcode.RDMA_WRITE_ONLY, 1, 0)),
    ("extra AETH", Packet(Opcode.SEND_ONLY, 1, 0, aeth=AETH(0, 0))),
    ("payload on an ACK", Packet(Opcode.ACKNOWLEDGE, 1, 0, aeth=AETH(0x1F, 0), payload=b"xx")),
    ("payload on a READ request", Packet(Opcode.RDMA_READ_REQUEST, 1, 0, reth=RETH(0, 1, 4), payload=b"x")),
    ("syndrome over 8 bits", Packet(Opcode.ACKNOWLEDGE, 1, 0, aeth=AETH(256, 0))),
    ("MSN over 24 bits", Packet(Opcode.ACKNOWLEDGE, 1, 0, aeth=AETH(0, 1 << 24))),
    ("rkey over 32 bits", Packet(Opcode.RDMA_READ_REQUEST, 1, 0, reth=RETH(0, 1 << 32, 4))),
    ("ImmDt over 32 bits", Packet(Opcode.SEND_ONLY_WITH_IMMEDIATE, 1, 0, imm=1 << 32)),
    ("not an RC opcode", Packet(0x64, 1, 0)),  # type: ignore[arg-type]
    ("opcode not an int", Packet("SEND_ONLY", 1, 0)),  # type: ignore[arg-type]
    ("payload of 4-byte items", Packet(Opcode.SEND_ONLY, 1, 0, payload=memoryview(bytearray(8)).cast("I"))),
]


@pytest.mark.parametrize(("why", "pkt"), BAD, ids=[why for why, _ in BAD])
def test_send_packet_hands_back_what_the_encoder_refuses(pair: _Pair, why: str, pkt: Any) -> None:
    with pytest.raises(LocalWireError):
        encode_headers(pkt)
    assert pair.send(pkt) == -1, why
    assert pair.nothing_arrived()


def test_send_packet_hands_back_what_is_not_a_packet(pair: _Pair) -> None:
    assert pair.send((1, 2, 3)) == -1
    assert pair.send("packet") == -1
    assert pair.send((*Packet(Opcode.SEND_ONLY, 1, 0)[:15], "text")) == -1  # payload not a buffer
    if pair.codec is fastpath.NATIVE:
        # The Python encoder takes any 3-sequence as a RETH; the native one only tuples (RETH is one).
        assert pair.send(Packet(Opcode.RDMA_READ_REQUEST, 1, 0, reth=[0, 1, 4])) == -1  # type: ignore[arg-type]
    assert pair.nothing_arrived()


@native_only
def test_send_packet_reports_the_errno_of_sendmsg(pair: _Pair) -> None:
    pkt = Packet(Opcode.SEND_ONLY, 1, 0, payload=b"x")
    err = native.send_packet(pair.tx.fileno(), ("127.0.0.1", 0), False, pkt, pair.flow.states, pair.flow)
    assert err > 0  # port 0: EINVAL here
    with pytest.raises(ValueError, match="not an IPv4 address"):
        native.send_packet(pair.tx.fileno(), ("::1", 9), False, pkt, pair.flow.states, pair.flow)


FLOW = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 40000, 4791)


def _segment(body: bytes, idx: int = 0) -> memoryview:
    return memoryview(bytearray(body + pack_icrc(FLOW.icrc_seg(idx, body))))


@settings(max_examples=600, deadline=None)
@given(pkt=packets(max_payload=300), idx=st.sampled_from([0, 1, 14, 63]))
def test_check_decode_is_decode_after_the_icrc(pkt: Packet, idx: int, codec: SegmentCodec) -> None:
    seg = _segment(encode(pkt), idx)
    got = codec.check_decode(seg, idx, FLOW.states, FLOW)
    want = decode(seg[:-4])
    assert type(got) is Packet
    assert got == want
    assert got.opcode is want.opcode
    for i in range(9, 12):
        assert type(got[i]) is type(want[i])
    assert isinstance(got.payload, memoryview)
    assert got.payload.obj is seg.obj  # zero copy: a view of the segment's buffer
    assert not got.payload.readonly


@settings(max_examples=300, deadline=None)
@given(pkt=packets(max_payload=64), bit=st.integers(0, 1 << 20))
def test_check_decode_says_0_for_a_spoiled_icrc(pkt: Packet, bit: int, codec: SegmentCodec) -> None:
    """A flipped bit: 0 (the ICRC does not check), or 1 where the header no longer decodes."""
    seg = _segment(encode(pkt))
    bit %= len(seg) * 8
    if bit // 8 == 4:
        return  # FECN, BECN and resv6 are outside the ICRC (they count as ones)
    seg[bit // 8] ^= 1 << (bit % 8)
    try:
        decode(seg[:-4])
    except WireError:
        assert codec.check_decode(seg, 0, FLOW.states, FLOW) == 1  # refused before the ICRC
    else:
        assert codec.check_decode(seg, 0, FLOW.states, FLOW) == 0


def test_check_decode_checks_the_header_before_the_icrc(codec: SegmentCodec) -> None:
    """What decode refuses is 1 whatever its ICRC, and costs no ICRC state (rxe: hdr_check first)."""
    ack = encode(Packet(Opcode.ACKNOWLEDGE, 1, 2, aeth=AETH(0x1F, 3)))
    bad_tver = bytes((4, 1)) + bytes(10)
    for body in (bad_tver, ack + b"abcd", b"\x64" + bytes(11)):
        seg = memoryview(bytearray(body + b"\xde\xad\xbe\xef"))  # an ICRC no ID explains
        flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 40000, 4791)
        assert codec.check_decode(seg, 0, flow.states, flow) == 1
        assert flow.states == {}  # flow.state() was never asked for
    good = _segment(ack)
    good[-1] ^= 1
    flow = IcrcFlow.ipv4(bytes((127, 0, 0, 9)), bytes((127, 0, 0, 8)), 40000, 4791)
    assert codec.check_decode(good, 0, flow.states, flow) == 0
    assert len(flow.states) == 1


def test_check_decode_leaves_what_decode_refuses_to_decode(codec: SegmentCodec) -> None:
    ack = encode(Packet(Opcode.ACKNOWLEDGE, 1, 2, aeth=AETH(0x1F, 3)))
    cases = {
        "unknown opcode": b"\x64" + bytes(11),
        "TVer 1": bytes((4, 1)) + bytes(10),
        "not a word multiple": encode(Packet(Opcode.SEND_ONLY, 1, 0)) + b"x",
        "payload on an ACK": ack + b"abcd",
        "pad longer than the payload": bytes((int(Opcode.ACKNOWLEDGE), 0x30)) + ack[2:],
    }
    for why, body in cases.items():
        with pytest.raises(WireError):
            decode(body)
        assert codec.check_decode(_segment(body), 0, FLOW.states, FLOW) == 1, why
    assert codec.check_decode(memoryview(b"\x04" * 15), 0, FLOW.states, FLOW) == 1  # no BTH and ICRC


@native_only
def test_check_decode_rejects_bad_arguments() -> None:
    seg = _segment(encode(Packet(Opcode.SEND_ONLY, 1, 0)))
    with pytest.raises(ValueError, match="u16"):
        native.check_decode(seg, 1 << 16, FLOW.states, FLOW)
    with pytest.raises(TypeError):
        native.check_decode("text", 0, FLOW.states, FLOW)
    with pytest.raises(TypeError):
        native.check_decode(seg, 0, [], FLOW)
    broken = dict.fromkeys([len(seg)], "state")
    with pytest.raises(TypeError):
        native.check_decode(seg, 0, broken, FLOW)


@native_only
def test_the_layout_numbers_are_those_of_the_c_enum() -> None:
    """``_fastpath.c`` numbers the header layouts as rdmakit.wire.packet does (its enum, in order)."""
    from rdmakit.wire import packet as packet_mod

    layouts = (packet_mod._L_BARE, packet_mod._L_AETH, packet_mod._L_AETH_ONLY, packet_mod._L_RETH,
               packet_mod._L_RETH_ONLY, packet_mod._L_IMM, packet_mod._L_RETH_IMM, packet_mod._L_IETH,
               packet_mod._L_ATOMIC, packet_mod._L_ATOMIC_ACK)  # fmt: skip
    assert layouts == tuple(range(10))
    for op, (member, _layout, hlen) in packet_mod.CODEC_LAYOUTS.items():
        assert int(member) == op
        assert struct.calcsize(">BBHII") <= hlen <= 40


@settings(max_examples=2000, deadline=None)
@given(body=st.binary(min_size=0, max_size=96), op=st.sampled_from([*range(0x18), 0x1F, 0x64, 0xFF]))
def test_check_decode_of_any_bytes_is_decode_or_hands_them_back(
    body: bytes, op: int, codec: SegmentCodec
) -> None:
    """Arbitrary bytes with a good ICRC: the same Packet as ``decode``, or 1 where it raises."""
    data = bytes((op,)) + body
    try:
        want: Packet | None = decode(data)
    except WireError:
        want = None
    if len(data) < 12:
        seg = memoryview(bytearray(data + bytes(4)))
        assert codec.check_decode(seg, 0, FLOW.states, FLOW) == 1
        return
    got = codec.check_decode(_segment(data), 0, FLOW.states, FLOW)
    if want is None:
        assert got == 1
    else:
        assert type(got) is Packet
        assert got == want


@native_only
def test_init_codec_refuses_a_table_that_does_not_match_its_layouts() -> None:
    from rdmakit.wire import AETH, CODEC_LAYOUTS, RETH, AtomicETH

    member, layout, hlen = CODEC_LAYOUTS[int(Opcode.RDMA_WRITE_ONLY)]
    for bad in ({4: (member, layout, hlen + 4)}, {4: (member, 10, hlen)}, {256: (member, layout, hlen)}):
        with pytest.raises(ValueError, match="bad table entry"):
            native.init_codec(Packet, RETH, AETH, AtomicETH, bad)
    with pytest.raises(TypeError):
        native.init_codec(Packet, RETH, AETH, int, CODEC_LAYOUTS)
    native.init_codec(Packet, RETH, AETH, AtomicETH, CODEC_LAYOUTS)  # what the import did
    seg = _segment(encode(Packet(Opcode.RDMA_WRITE_ONLY, 1, 2, reth=RETH(3, 4, 1), payload=b"z")))
    assert native.check_decode(seg, 0, FLOW.states, FLOW) == decode(seg[:-4])
