"""Hypothesis strategies for RC packets (IBTA Vol. 1 §9), and the canonical form of packet bytes.

Needs hypothesis, an optional dependency: ``pip install 'rdmakit[testing]'``.
"""

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rdmakit.testing.strategies needs hypothesis, which is not installed: "
        "pip install 'rdmakit[testing]' (or hypothesis itself)"
    ) from exc

from rdmakit.wire import AETH, OPCODE_INFO, RETH, AtomicETH, Opcode, Packet

__all__ = ["OPCODES", "U8", "U16", "U24", "U32", "U64", "buffers", "canonical", "packets"]

U8 = st.integers(0, 0xFF)
U16 = st.integers(0, 0xFFFF)
U24 = st.integers(0, 0xFFFFFF)
U32 = st.integers(0, 0xFFFF_FFFF)
U64 = st.integers(0, 0xFFFF_FFFF_FFFF_FFFF)
OPCODES = st.sampled_from(sorted(Opcode))


def buffers(max_size: int = 64) -> st.SearchStrategy[bytes | bytearray | memoryview]:
    """Payloads as every buffer type the encoder takes."""
    data = st.binary(max_size=max_size)
    return st.one_of(data, data.map(bytearray), data.map(_view))


def _view(data: bytes) -> memoryview:
    return memoryview(data)


@st.composite
def packets(draw: st.DrawFn, opcodes: st.SearchStrategy[Opcode] = OPCODES, max_payload: int = 64) -> Packet:
    """A valid RC packet: the header set its opcode calls for, every field in range."""
    op = draw(opcodes)
    info = OPCODE_INFO[op]
    return Packet(
        op,
        draw(U24),
        draw(U24),
        ackreq=draw(st.booleans()),
        se=draw(st.booleans()),
        migreq=draw(st.booleans()),
        pkey=draw(U16),
        fecn=draw(st.booleans()),
        becn=draw(st.booleans()),
        reth=RETH(draw(U64), draw(U32), draw(U32)) if info.reth else None,
        aeth=AETH(draw(U8), draw(U24)) if info.aeth else None,
        atomic_eth=AtomicETH(draw(U64), draw(U32), draw(U64), draw(U64)) if info.atomic_eth else None,
        atomic_ack=draw(U64) if info.atomic_ack_eth else None,
        imm=draw(U32) if info.imm else None,
        ieth=draw(U32) if info.ieth else None,
        payload=draw(buffers(max_payload)) if info.payload else b"",
    )


def canonical(data: bytes | bytearray | memoryview) -> bytes:
    """``data`` with the bits the decoder ignores cleared: reserved BTH bits and pad bytes."""
    c = bytearray(data)
    c[4] &= 0xC0  # FECN, BECN; resv6 cleared
    c[8] &= 0x80  # AckReq; resv7 cleared
    pad = (c[1] >> 4) & 3
    c[len(c) - pad :] = bytes(pad)
    return bytes(c)
