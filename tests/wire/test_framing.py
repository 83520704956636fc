"""TCP framing: a 4-byte big-endian length, then one packet (BTH .. pad, no ICRC)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmakit.testing.strategies import packets
from rdmakit.wire import (
    BTH_LEN,
    FRAME_HEADER,
    MAX_FRAME,
    MAX_HEADERS,
    FrameDecoder,
    LocalWireError,
    Packet,
    WireError,
    decode,
    encode,
    frame_header,
    max_frame_body,
)


def framed(bodies: list[bytes]) -> bytes:
    return b"".join(frame_header(len(b)) + b for b in bodies)


def drain(d: FrameDecoder) -> list[bytes]:
    out = []
    while (body := d.next_frame()) is not None:
        out.append(body)
    return out


def test_frame_header_bytes() -> None:
    assert FRAME_HEADER.size == 4
    assert frame_header(12) == b"\0\0\0\x0c"
    assert frame_header(0x0123456) == b"\x00\x12\x34\x56"
    assert frame_header(MAX_FRAME) == (1 << 26).to_bytes(4, "big")


@pytest.mark.parametrize("n", [-1, 0, 1, BTH_LEN - 1, MAX_FRAME + 1, 1 << 32])
def test_frame_header_out_of_range_is_the_callers_fault(n: int) -> None:
    with pytest.raises(LocalWireError, match="out of range"):
        frame_header(n)


def test_one_byte_at_a_time() -> None:
    bodies = [encode(Packet(2, 1, i, payload=b"x" * i)) for i in range(5)]  # type: ignore[arg-type]
    stream = framed(bodies)
    d = FrameDecoder()
    got = []
    for i in range(len(stream)):
        d.feed(stream[i : i + 1])
        got += drain(d)
        assert d.buffered == (i + 1) - sum(4 + len(b) for b in got)
    assert got == bodies
    assert d.buffered == 0


def test_many_frames_in_one_feed() -> None:
    bodies = [encode(Packet(4, 7, i, payload=bytes([i]) * (i * 13))) for i in range(50)]  # type: ignore[arg-type]
    d = FrameDecoder()
    d.feed(framed(bodies))
    assert drain(d) == bodies
    assert d.next_frame() is None
    assert d.buffered == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(packets(max_payload=100), min_size=1, max_size=12), st.data())
def test_any_split_of_a_stream_gives_the_same_packets(pkts: list[Packet], data: st.DataObject) -> None:
    bodies = [encode(p) for p in pkts]
    stream = framed(bodies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    kind = data.draw(st.sampled_from([bytes, bytearray, memoryview]))
    d = FrameDecoder()
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        d.feed(kind(stream[a:b]))
        got += drain(d)
    assert got == bodies
    assert [decode(b) for b in got] == pkts
    assert d.buffered == 0


def test_frames_are_independent_copies() -> None:
    d = FrameDecoder()
    d.feed(framed([b"A" * 12, b"B" * 16]))
    first = d.next_frame()
    d.feed(framed([b"C" * 12]))  # compacts the buffer
    assert first == b"A" * 12
    assert drain(d) == [b"B" * 16, b"C" * 12]
    assert isinstance(first, bytes)


@pytest.mark.parametrize("n", [0, 1, BTH_LEN - 1, MAX_FRAME + 1, 0xFFFFFFFF])
def test_bad_length_is_the_peers_fault_before_the_body_arrives(n: int) -> None:
    d = FrameDecoder()
    d.feed(framed([b"\0" * 12]) + n.to_bytes(4, "big"))
    assert d.next_frame() == b"\0" * 12
    with pytest.raises(WireError, match="out of range") as e:
        d.next_frame()
    assert type(e.value) is WireError
    with pytest.raises(WireError):  # the stream cannot recover
        d.next_frame()


def test_max_frame_waits_without_allocating_the_body() -> None:
    d = FrameDecoder()
    d.feed(MAX_FRAME.to_bytes(4, "big") + b"\0" * 100)
    assert d.next_frame() is None
    assert d.buffered == 104


def test_partial_header_waits() -> None:
    d = FrameDecoder()
    d.feed(b"\0\0")
    assert d.next_frame() is None
    d.feed(b"\0\x0c" + b"x" * 11)
    assert d.next_frame() is None
    d.feed(b"y")
    assert d.next_frame() == b"x" * 11 + b"y"


@pytest.mark.parametrize("thing", [None, "text", 5])
def test_feed_takes_only_byte_buffers(thing: object) -> None:
    with pytest.raises(LocalWireError):
        FrameDecoder().feed(thing)  # type: ignore[arg-type]


def test_a_decoder_that_knows_the_mtu_refuses_longer_frames_at_once() -> None:
    limit = max_frame_body(4096)
    assert limit == 4096 + MAX_HEADERS
    d = FrameDecoder(limit)
    d.feed(frame_header(limit) + b"\0" * limit)
    assert d.next_frame() == b"\0" * limit
    d.feed(frame_header(limit + 1))  # the header alone: no body needed to refuse it
    with pytest.raises(WireError, match="out of range"):
        d.next_frame()


@pytest.mark.parametrize("max_body", [BTH_LEN - 1, MAX_FRAME + 1])
def test_a_decoder_bound_outside_the_framing_is_the_callers_fault(max_body: int) -> None:
    with pytest.raises(LocalWireError):
        FrameDecoder(max_body)
