"""RoCEv2 RC packets: the BTH, its extension headers, payload and pad.

Layout (IBTA Vol. 1 §9.2-§9.4; RoCEv2 Annex A17.4): BTH (12 bytes), then the
extension headers the opcode calls for, in the order RETH, AETH, AtomicETH,
AtomicAckETH, ImmDt, IETH; then payload and 0-3 pad bytes (the BTH's PadCnt).
The ICRC that follows on a RoCEv2 UDP datagram is handled in :mod:`.icrc`.
All multi-byte fields are big-endian.
"""

import struct
from enum import IntEnum
from typing import NamedTuple

from .errors import WireError
from .opcodes import OPCODE_INFO, Opcode, OpInfo

BTH_LEN = 12
ICRC_LEN = 4
#: P_Key rxe sends and accepts (IBTA §10.9.1 default partition, full member).
DEFAULT_PKEY = 0xFFFF

_BTH = struct.Struct(">BBHII")
_RETH = struct.Struct(">QII")
_AETH = struct.Struct(">I")
_ATOMIC_ETH = struct.Struct(">QIQQ")
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


class RETH(NamedTuple):
    """RDMA Extended Transport Header (IBTA §9.3.3): 16 bytes."""

    va: int
    rkey: int
    dma_len: int


class AETH(NamedTuple):
    """ACK Extended Transport Header (IBTA §9.3.5): syndrome u8, MSN u24."""

    syndrome: int
    msn: int


class AtomicETH(NamedTuple):
    """Atomic Extended Transport Header (IBTA §9.3.4): 28 bytes.

    On the wire the swap (or add) value precedes the compare value.
    """

    va: int
    rkey: int
    swap_add: int
    compare: int


class AckKind(IntEnum):
    """AETH syndrome bits 7:5 (IBTA §9.7.5.1 table 44)."""

    ACK = 0b000
    RNR_NAK = 0b001
    NAK = 0b011


class NakCode(IntEnum):
    """AETH syndrome bits 4:0 when the kind is NAK (IBTA §9.7.5.1 table 45)."""

    PSN_SEQUENCE_ERROR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS_ERROR = 2
    REMOTE_OPERATIONAL_ERROR = 3
    INVALID_RD_REQUEST = 4


#: Credit field value meaning "no end-to-end flow control" (IBTA §9.7.7.2.5);
#: rxe always advertises it (``AETH_ACK_UNLIMITED``).
CREDITS_UNLIMITED = 0x1F


def ack_syndrome(credits: int = CREDITS_UNLIMITED) -> int:
    return (AckKind.ACK << 5) | (credits & 0x1F)


def rnr_syndrome(timer: int) -> int:
    """RNR NAK carrying an RNR timer code (IBTA §9.7.5.2.8 table 46)."""
    return (AckKind.RNR_NAK << 5) | (timer & 0x1F)


def nak_syndrome(code: NakCode) -> int:
    return (AckKind.NAK << 5) | int(code)


def parse_syndrome(syndrome: int) -> tuple[AckKind, int]:
    """Split an AETH syndrome into its kind and 5-bit value.

    Raises WireError for the reserved kinds (010, 1xx).
    """
    try:
        kind = AckKind(syndrome >> 5)
    except ValueError:
        raise WireError(f"reserved AETH syndrome 0x{syndrome:02x}") from None
    return kind, syndrome & 0x1F


Payload = bytes | bytearray | memoryview


class Packet(NamedTuple):
    """One RC packet, without the ICRC.

    ``payload`` is the message data only; the pad is derived from its length.
    ``imm`` is the ImmDt u32 exactly as on the wire; ``atomic_ack`` the
    AtomicAckETH original data; ``ieth`` the R_Key to invalidate.
    """

    opcode: Opcode
    dest_qp: int
    psn: int
    ackreq: bool = False
    se: bool = False
    migreq: bool = False
    pkey: int = DEFAULT_PKEY
    fecn: bool = False
    becn: bool = False
    reth: RETH | None = None
    aeth: AETH | None = None
    atomic_eth: AtomicETH | None = None
    atomic_ack: int | None = None
    imm: int | None = None
    ieth: int | None = None
    payload: Payload = b""

    @property
    def info(self) -> OpInfo:
        return OPCODE_INFO[self.opcode]


def pad_len(payload_len: int) -> int:
    """Pad bytes after a payload (IBTA §9.2: to a 4-byte multiple)."""
    return -payload_len & 3


_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")


def encode_headers(pkt: Packet) -> bytes:
    """BTH and extension headers for ``pkt``; the PadCnt comes from the payload."""
    info = OPCODE_INFO.get(pkt.opcode)
    if info is None:
        raise WireError(f"not an RC opcode: 0x{int(pkt.opcode):02x}")
    plen = len(pkt.payload)
    if plen and not info.payload:
        raise WireError(f"{info.opcode.name} carries no payload")
    byte1 = (pkt.se << 7) | (pkt.migreq << 6) | (pad_len(plen) << 4)
    word1 = (pkt.fecn << 31) | (pkt.becn << 30) | (pkt.dest_qp & 0xFFFFFF)
    word2 = (pkt.ackreq << 31) | (pkt.psn & 0xFFFFFF)
    out = _BTH.pack(pkt.opcode, byte1, pkt.pkey, word1, word2)
    if info.ext_len == 0:
        return out
    try:
        if info.reth:
            assert pkt.reth is not None, "RETH required"
            out += _RETH.pack(*pkt.reth)
        if info.aeth:
            assert pkt.aeth is not None, "AETH required"
            out += _AETH.pack((pkt.aeth.syndrome << 24) | (pkt.aeth.msn & 0xFFFFFF))
        if info.atomic_eth:
            assert pkt.atomic_eth is not None, "AtomicETH required"
            out += _ATOMIC_ETH.pack(*pkt.atomic_eth)
        if info.atomic_ack_eth:
            assert pkt.atomic_ack is not None, "AtomicAckETH required"
            out += _U64.pack(pkt.atomic_ack)
        if info.imm:
            assert pkt.imm is not None, "ImmDt required"
            out += _U32.pack(pkt.imm)
        if info.ieth:
            assert pkt.ieth is not None, "IETH required"
            out += _U32.pack(pkt.ieth)
    except (AssertionError, struct.error) as e:
        raise WireError(f"{info.opcode.name}: {e}") from None
    return out


def pad_bytes(payload_len: int) -> bytes:
    return _PADS[-payload_len & 3]


def encode(pkt: Packet) -> bytes:
    """The whole packet without ICRC: headers, payload, pad."""
    return encode_headers(pkt) + bytes(pkt.payload) + _PADS[-len(pkt.payload) & 3]


def decode(data: bytes | bytearray | memoryview) -> Packet:
    """Parse a packet (BTH .. pad, no ICRC).

    The payload is a zero-copy ``memoryview`` slice of ``data``. Raises
    :class:`WireError` and nothing else, whatever the bytes.
    """
    try:
        mv = data if isinstance(data, memoryview) else memoryview(data)
        if mv.ndim != 1 or mv.itemsize != 1 or not mv.contiguous:
            mv = memoryview(mv.tobytes())
    except TypeError as e:
        raise WireError(f"not a byte buffer: {e}") from None
    n = len(mv)
    if n < BTH_LEN:
        raise WireError(f"packet of {n} bytes is shorter than a BTH")
    op, byte1, pkey, word1, word2 = _BTH.unpack_from(mv, 0)
    info = OPCODE_INFO.get(op)
    if info is None:
        raise WireError(f"unknown or non-RC opcode 0x{op:02x}")
    if byte1 & 0x0F:
        # IBTA §9.2.1.4: TVer must be 0; rxe drops others (hdr_check()).
        raise WireError(f"unsupported transport header version {byte1 & 0x0F}")
    pad = (byte1 >> 4) & 3
    off = BTH_LEN
    end = n - pad
    if end < off + info.ext_len:
        raise WireError(f"{info.opcode.name}: {n} bytes cannot hold its headers and pad")
    reth = aeth = atomic_eth = None
    atomic_ack = imm = ieth = None
    if info.reth:
        reth = RETH._make(_RETH.unpack_from(mv, off))
        off += 16
    if info.aeth:
        (w,) = _AETH.unpack_from(mv, off)
        aeth = AETH(w >> 24, w & 0xFFFFFF)
        off += 4
    if info.atomic_eth:
        atomic_eth = AtomicETH._make(_ATOMIC_ETH.unpack_from(mv, off))
        off += 28
    if info.atomic_ack_eth:
        (atomic_ack,) = _U64.unpack_from(mv, off)
        off += 8
    if info.imm:
        (imm,) = _U32.unpack_from(mv, off)
        off += 4
    if info.ieth:
        (ieth,) = _U32.unpack_from(mv, off)
        off += 4
    if not info.payload and end != off:
        raise WireError(f"{info.opcode.name} carries no payload, got {end - off} bytes")
    return Packet(
        info.opcode,
        word1 & 0xFFFFFF,
        word2 & 0xFFFFFF,
        bool(word2 >> 31),
        bool(byte1 & 0x80),
        bool(byte1 & 0x40),
        pkey,
        bool(word1 >> 31),
        bool(word1 & 0x40000000),
        reth,
        aeth,
        atomic_eth,
        atomic_ack,
        imm,
        ieth,
        mv[off:end],
    )
