"""RoCEv2 RC packets: the BTH, its extension headers, payload and pad.

Layout (IBTA Vol. 1 §9.2-§9.4; RoCEv2 Annex A17.4): BTH (12 bytes), then the
extension headers the opcode calls for, in the order RETH, AETH, AtomicETH,
AtomicAckETH, ImmDt, IETH; then payload and 0-3 pad bytes (the BTH's PadCnt).
The ICRC that follows on a RoCEv2 UDP datagram is handled in :mod:`.icrc`.
All multi-byte fields are big-endian.

Invariants the codec keeps (checked by ``tests/wire``):

* ``decode(encode(p)) == p`` for every valid ``Packet`` ``p``;
* ``encode(decode(b)) == b`` for every ``b`` that ``decode`` accepts, once the
  reserved BTH bits (byte 4 bits 5:0, byte 8 bits 6:0) and the pad bytes of
  ``b`` are cleared: those are the only bits ``decode`` ignores;
* ``decode`` raises :class:`WireError` and nothing else; the encoders raise
  :class:`LocalWireError` for a ``Packet`` that cannot go on the wire.

The hot paths are written flat on purpose: one precompiled ``struct`` per
header layout packs or unpacks the BTH and its extension headers in one call,
no ``Enum`` is constructed, and ``Packet`` is built with ``tuple.__new__``.
"""

import bisect
import struct
from enum import IntEnum
from typing import Any, NamedTuple

from .errors import LocalWireError, WireError
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


#: AETH credit code -> receive WQEs it grants (IBTA §9.7.5.1 table 45); code 0x1F is not here.
CREDIT_COUNTS = (
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
    1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
)  # fmt: skip


def ack_syndrome(credits: int = CREDITS_UNLIMITED) -> int:
    return (AckKind.ACK << 5) | (credits & 0x1F)


def credit_code(wqes: int) -> int:
    """The largest credit code granting no more than ``wqes`` receive WQEs (table 45)."""
    return bisect.bisect_right(CREDIT_COUNTS, wqes) - 1 if wqes > 0 else 0


def rnr_syndrome(timer: int) -> int:
    """RNR NAK carrying an RNR timer code (IBTA §9.7.5.2.8 table 46)."""
    return (AckKind.RNR_NAK << 5) | (timer & 0x1F)


def nak_syndrome(code: NakCode) -> int:
    return (AckKind.NAK << 5) | int(code)


#: Syndrome bits 7:5 -> kind; None for the reserved kinds 010 and 1xx.
_ACK_KINDS: tuple[AckKind | None, ...] = tuple(
    AckKind(k) if k in AckKind._value2member_map_ else None for k in range(8)
)


def parse_syndrome(syndrome: int) -> tuple[AckKind, int]:
    """Split an AETH syndrome (a u8) into its kind and 5-bit value.

    Raises WireError for the reserved kinds (010, 1xx) and for values that are
    not a u8.
    """
    try:
        kind = _ACK_KINDS[syndrome >> 5] if 0 <= syndrome <= 0xFF else None
    except TypeError:
        raise WireError(f"AETH syndrome is not an int: {syndrome!r}") from None
    if kind is None:
        raise WireError(f"reserved AETH syndrome 0x{syndrome:02x}")
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


class Train(NamedTuple):
    """A run of ``npkts`` MIDDLE packets of one message, as one object.

    Packet ``i`` is ``opcode`` to ``dest_qp`` with PSN ``psn + i`` (mod 2^24),
    the default P_Key, no extension header, and ``payload[i*mtu:(i+1)*mtu]``;
    it asks for an ACK when ``i >= ack_first >= 0`` and ``(i - ack_first) %
    ack_every == 0``. A sender that builds headers in bulk takes a train as it
    is; :meth:`packets` gives the same packets one by one.
    """

    opcode: Opcode
    dest_qp: int
    psn: int
    npkts: int
    payload: memoryview
    mtu: int
    ack_first: int = -1
    ack_every: int = 1

    def ackreq(self, i: int) -> bool:
        first = self.ack_first
        return 0 <= first <= i and (i - first) % self.ack_every == 0

    def tail(self, j: int) -> "Train":
        """The same train from its packet ``j`` on."""
        first, every = self.ack_first, self.ack_every
        if first >= 0:
            first = first - j if first >= j else (-(j - first) % every)
            if first >= self.npkts - j:
                first = -1
        mtu = self.mtu
        return self._replace(
            psn=(self.psn + j) & 0xFFFFFF,
            npkts=self.npkts - j,
            payload=self.payload[j * mtu :],
            ack_first=first,
        )

    def packets(self) -> list[Packet]:
        op, dqp, psn, mtu, pl = self.opcode, self.dest_qp, self.psn, self.mtu, self.payload
        return [
            Packet(op, dqp, (psn + i) & 0xFFFFFF, self.ackreq(i), payload=pl[i * mtu : (i + 1) * mtu])
            for i in range(self.npkts)
        ]


def pad_len(payload_len: int) -> int:
    """Pad bytes after a payload (IBTA §9.2: to a 4-byte multiple)."""
    return -payload_len & 3


_PADS = (b"", b"\0", b"\0\0", b"\0\0\0")


def pad_bytes(payload_len: int) -> bytes:
    return _PADS[-payload_len & 3]


# --- Header layouts -------------------------------------------------------------
#
# Every RC opcode has one of these layouts: the extension headers after the BTH
# and whether a payload may follow. One struct per layout covers the BTH and all
# of its extension headers. The layout of each opcode is derived from
# OPCODE_INFO (below), not written twice.

_L_BARE = 0  # payload only: SEND_FIRST/MIDDLE/LAST/ONLY, WRITE_MIDDLE/LAST, READ_RESPONSE_MIDDLE
_L_AETH = 1  # AETH + payload: READ_RESPONSE_FIRST/LAST/ONLY
_L_AETH_ONLY = 2  # AETH: ACKNOWLEDGE
_L_RETH = 3  # RETH + payload: WRITE_FIRST/ONLY
_L_RETH_ONLY = 4  # RETH: READ_REQUEST
_L_IMM = 5  # ImmDt + payload: SEND_LAST/ONLY_WITH_IMMEDIATE, WRITE_LAST_WITH_IMMEDIATE
_L_RETH_IMM = 6  # RETH + ImmDt + payload: WRITE_ONLY_WITH_IMMEDIATE
_L_IETH = 7  # IETH + payload: SEND_LAST/ONLY_WITH_INVALIDATE
_L_ATOMIC = 8  # AtomicETH: COMPARE_SWAP, FETCH_ADD
_L_ATOMIC_ACK = 9  # AETH + AtomicAckETH: ATOMIC_ACKNOWLEDGE

# (reth, aeth, atomic_eth, atomic_ack_eth, imm, ieth, payload) -> layout
_LAYOUT_OF_HEADERS = {
    (False, False, False, False, False, False, True): _L_BARE,
    (False, True, False, False, False, False, True): _L_AETH,
    (False, True, False, False, False, False, False): _L_AETH_ONLY,
    (True, False, False, False, False, False, True): _L_RETH,
    (True, False, False, False, False, False, False): _L_RETH_ONLY,
    (False, False, False, False, True, False, True): _L_IMM,
    (True, False, False, False, True, False, True): _L_RETH_IMM,
    (False, False, False, False, False, True, True): _L_IETH,
    (False, False, True, False, False, False, False): _L_ATOMIC,
    (False, True, False, True, False, False, False): _L_ATOMIC_ACK,
}

#: BTH + extension headers of each layout, as one struct.
_STRUCTS = {
    _L_BARE: _BTH,
    _L_AETH: struct.Struct(">BBHIII"),
    _L_AETH_ONLY: struct.Struct(">BBHIII"),
    _L_RETH: struct.Struct(">BBHIIQII"),
    _L_RETH_ONLY: struct.Struct(">BBHIIQII"),
    _L_IMM: struct.Struct(">BBHIII"),
    _L_RETH_IMM: struct.Struct(">BBHIIQIII"),
    _L_IETH: struct.Struct(">BBHIII"),
    _L_ATOMIC: struct.Struct(">BBHIIQIQQ"),
    _L_ATOMIC_ACK: struct.Struct(">BBHIIIQ"),
}


def _layout(info: OpInfo) -> int:
    key = (info.reth, info.aeth, info.atomic_eth, info.atomic_ack_eth, info.imm, info.ieth, info.payload)
    layout = _LAYOUT_OF_HEADERS[key]
    assert _STRUCTS[layout].size == BTH_LEN + info.ext_len, info
    return layout


#: opcode -> layout, for the encoder (keys are Opcode members; ints hash the same).
_ENC_LAYOUT: dict[int, int] = {op: _layout(info) for op, info in OPCODE_INFO.items()}
#: opcode byte -> (Opcode member, layout, BTH + extension header length), for the decoder
#: and for native codecs (``rdmakit.transport._fastpath``: layouts numbered as ``_L_*``).
CODEC_LAYOUTS: dict[int, tuple[Opcode, int, int]] = {
    int(op): (info.opcode, _layout(info), BTH_LEN + info.ext_len) for op, info in OPCODE_INFO.items()
}

#: PadCnt (byte 1 bits 5:4) for a payload length mod 4.
_PADCNT_BITS = (0x00, 0x30, 0x20, 0x10)
_U24 = 0xFFFFFF

_S_BTH = _BTH
_S_AETH = _STRUCTS[_L_AETH]
_S_RETH = _STRUCTS[_L_RETH]
_S_RETH_IMM = _STRUCTS[_L_RETH_IMM]
_S_ATOMIC = _STRUCTS[_L_ATOMIC]
_S_ATOMIC_ACK = _STRUCTS[_L_ATOMIC_ACK]
_S_U32 = _STRUCTS[_L_IMM]  # BTH + one u32: ImmDt or IETH


class _Invalid(Exception):
    """The fast path met something it does not handle; the slow path says what."""


def encode_headers(pkt: Packet) -> bytes:
    """BTH and extension headers for ``pkt``; the PadCnt comes from the payload.

    Raises :class:`LocalWireError` if the opcode is not an RC opcode, a header
    the opcode carries is missing or one it does not carry is set, a payload is
    given to an opcode without one, or a field is out of range.
    """
    try:
        (op, qp, psn, ackreq, se, migreq, pkey, fecn, becn,
         reth, aeth, atomic_eth, atomic_ack, imm, ieth, payload) = pkt  # fmt: skip
        layout = _ENC_LAYOUT[op]
        plen = len(payload)
        if qp > _U24 or psn > _U24 or (type(payload) is memoryview and payload.itemsize != 1):
            raise _Invalid
        b1 = (0x80 if se else 0) | (0x40 if migreq else 0) | _PADCNT_BITS[plen & 3]
        w1 = (0x80000000 if fecn else 0) | (0x40000000 if becn else 0) | qp
        w2 = (0x80000000 if ackreq else 0) | psn
        if reth is None and atomic_eth is None and atomic_ack is None and imm is None and ieth is None:
            if layout == _L_BARE:
                if aeth is None:
                    return _S_BTH.pack(op, b1, pkey, w1, w2)
            elif aeth is not None and (layout == _L_AETH or (layout == _L_AETH_ONLY and not plen)):
                syndrome, msn = aeth
                if msn <= _U24:
                    return _S_AETH.pack(op, b1, pkey, w1, w2, (syndrome << 24) | msn)
        elif aeth is None and atomic_eth is None and atomic_ack is None and ieth is None:
            if imm is None:
                if reth is not None and (layout == _L_RETH or (layout == _L_RETH_ONLY and not plen)):
                    va, rkey, dma_len = reth
                    return _S_RETH.pack(op, b1, pkey, w1, w2, va, rkey, dma_len)
            elif reth is None:
                if layout == _L_IMM:
                    return _S_U32.pack(op, b1, pkey, w1, w2, imm)
            elif layout == _L_RETH_IMM:
                va, rkey, dma_len = reth
                return _S_RETH_IMM.pack(op, b1, pkey, w1, w2, va, rkey, dma_len, imm)
        elif reth is None and aeth is None and atomic_ack is None and imm is None:
            if atomic_eth is None:
                if layout == _L_IETH:
                    return _S_U32.pack(op, b1, pkey, w1, w2, ieth)
            elif ieth is None and layout == _L_ATOMIC and not plen:
                va, rkey, swap_add, compare = atomic_eth
                return _S_ATOMIC.pack(op, b1, pkey, w1, w2, va, rkey, swap_add, compare)
        elif (
            layout == _L_ATOMIC_ACK and not plen and aeth is not None and atomic_ack is not None
            and reth is None and atomic_eth is None and imm is None and ieth is None
        ):  # fmt: skip
            syndrome, msn = aeth
            if msn <= _U24:
                return _S_ATOMIC_ACK.pack(op, b1, pkey, w1, w2, (syndrome << 24) | msn, atomic_ack)
    except (_Invalid, KeyError, TypeError, ValueError, struct.error):
        pass
    raise LocalWireError(_why_not_encodable(pkt))


def _why_not_encodable(pkt: Any) -> str:
    """What is wrong with a packet the fast path refused (slow, thorough)."""
    if not isinstance(pkt, Packet):
        if not (isinstance(pkt, tuple) and len(pkt) == len(Packet._fields)):
            return f"not a Packet: {type(pkt).__name__}"
        pkt = Packet._make(pkt)
    try:
        info = OPCODE_INFO.get(pkt.opcode)
    except TypeError:
        info = None
    if info is None:
        return f"not an RC opcode: {pkt.opcode!r}"
    name = info.opcode.name
    for field, bits in (("dest_qp", 24), ("psn", 24), ("pkey", 16)):
        value = getattr(pkt, field)
        if not isinstance(value, int) or not 0 <= value < 1 << bits:
            return f"{name}: {field} {value!r} is not a u{bits}"
    payload = pkt.payload
    if not isinstance(payload, bytes | bytearray | memoryview) or (
        isinstance(payload, memoryview) and payload.itemsize != 1
    ):
        return f"{name}: payload {type(payload).__name__} is not a byte buffer"
    plen = len(payload)
    if plen and not info.payload:
        return f"{name} carries no payload"
    headers = (
        ("reth", "RETH", info.reth, RETH, ((64, "va"), (32, "rkey"), (32, "dma_len"))),
        ("aeth", "AETH", info.aeth, AETH, ((8, "syndrome"), (24, "msn"))),
        ("atomic_eth", "AtomicETH", info.atomic_eth, AtomicETH,
         ((64, "va"), (32, "rkey"), (64, "swap_add"), (64, "compare"))),
        ("atomic_ack", "AtomicAckETH", info.atomic_ack_eth, None, ((64, "atomic_ack"),)),
        ("imm", "ImmDt", info.imm, None, ((32, "imm"),)),
        ("ieth", "IETH", info.ieth, None, ((32, "ieth"),)),
    )  # fmt: skip
    for field, title, wanted, cls, widths in headers:
        value = getattr(pkt, field)
        if not wanted:
            if value is not None:
                return f"{name} carries no {title}"
            continue
        if value is None:
            return f"{name} lacks its {title}"
        values = (value,) if cls is None else tuple(value) if isinstance(value, tuple) else None
        if values is None or len(values) != len(widths):
            return f"{name}: {title} {value!r} is not a {cls.__name__ if cls else 'u' + str(widths[0][0])}"
        for v, (bits, fname) in zip(values, widths, strict=True):
            if not isinstance(v, int) or not 0 <= v < 1 << bits:
                return f"{name}: {title} {fname} {v!r} is not a u{bits}"
    return f"{name}: cannot encode {pkt!r}"


def encode(pkt: Packet) -> bytes:
    """The whole packet without ICRC: headers, payload, pad."""
    hdrs = encode_headers(pkt)
    payload = pkt[15]  # .payload, also for a plain 16-tuple
    pad = -len(payload) & 3
    try:
        if pad:
            return b"".join((hdrs, payload, _PADS[pad]))
        return hdrs + payload
    except (TypeError, BufferError) as e:
        raise LocalWireError(f"{pkt[0]!r}: payload is not a contiguous byte buffer: {e}") from None


_new_packet = tuple.__new__
_BYTES_TYPES = (bytes, bytearray)


def decode(data: bytes | bytearray | memoryview) -> Packet:
    """Parse a packet (BTH .. pad, no ICRC).

    The payload is a zero-copy ``memoryview`` slice of ``data``. Raises
    :class:`WireError` and nothing else, whatever the bytes. Reserved BTH bits
    and the contents of the pad bytes are ignored (IBTA §9.2: reserved fields
    are not checked by the receiver).
    """
    if type(data) in _BYTES_TYPES:
        mv = memoryview(data)
    else:
        mv = _byte_view(data)
    n = len(mv)
    if n < BTH_LEN:
        raise WireError(f"packet of {n} bytes is shorter than a BTH")
    op, b1, pkey, w1, w2 = _BTH.unpack_from(mv, 0)
    dec = CODEC_LAYOUTS.get(op)
    if dec is None:
        raise WireError(f"unknown or non-RC opcode 0x{op:02x}")
    opcode, layout, off = dec
    if b1 & 0x0F:
        # IBTA §9.2.1.4: TVer must be 0; rxe drops others (hdr_check()).
        raise WireError(f"unsupported transport header version {b1 & 0x0F}")
    if n & 3:
        # Headers, payload and pad fill whole 4-byte words (IBTA §9.2: PadCnt
        # aligns the payload; the IB LRH counts the packet length in words).
        raise WireError(f"{opcode.name}: packet of {n} bytes is not a multiple of 4")
    end = n - ((b1 >> 4) & 3)
    if end < off:
        raise WireError(f"{opcode.name}: {n} bytes cannot hold its headers and pad")
    ackreq = w2 >= 0x80000000
    se = b1 >= 0x80
    migreq = (b1 & 0x40) != 0
    fecn = w1 >= 0x80000000
    becn = (w1 & 0x40000000) != 0
    qp = w1 & _U24
    psn = w2 & _U24
    if layout == _L_BARE:
        return _new_packet(Packet, (opcode, qp, psn, ackreq, se, migreq, pkey, fecn, becn,
                                    None, None, None, None, None, None, mv[off:end]))  # fmt: skip
    if layout in (_L_AETH, _L_AETH_ONLY):
        (w,) = _AETH.unpack_from(mv, BTH_LEN)
        if layout == _L_AETH_ONLY and end != off:
            raise WireError(f"{opcode.name} carries no payload, got {end - off} bytes")
        aeth = _new_packet(AETH, (w >> 24, w & _U24))
        return _new_packet(Packet, (opcode, qp, psn, ackreq, se, migreq, pkey, fecn, becn,
                                    None, aeth, None, None, None, None, mv[off:end]))  # fmt: skip
    if layout in (_L_RETH, _L_RETH_ONLY):
        if layout == _L_RETH_ONLY and end != off:
            raise WireError(f"{opcode.name} carries no payload, got {end - off} bytes")
        reth = _new_packet(RETH, _RETH.unpack_from(mv, BTH_LEN))
        return _new_packet(Packet, (opcode, qp, psn, ackreq, se, migreq, pkey, fecn, becn,
                                    reth, None, None, None, None, None, mv[off:end]))  # fmt: skip
    if layout in (_L_IMM, _L_IETH):
        (v,) = _U32.unpack_from(mv, BTH_LEN)
        if layout == _L_IMM:
            return _new_packet(Packet, (opcode, qp, psn, ackreq, se, migreq, pkey, fecn, becn,
                                        None, None, None, None, v, None, mv[off:end]))  # fmt: skip
        return _new_packet(Packet, (opcode, qp, psn, ackreq, se, migreq, pkey, fecn, becn,
                                    None, None, None, None, None, v, mv[off:end]))  # fmt: skip
    if layout == _L_RETH_IMM:
        va, rkey, dma_len, imm = _S_RETH_IMM.unpack_from(mv, 0)[5:]
        reth = _new_packet(RETH, (va, rkey, dma_len))
        return _new_packet(Packet, (opcode, qp, psn, ackreq, se, migreq, pkey, fecn, becn,
                                    reth, None, None, None, imm, None, mv[off:end]))  # fmt: skip
    if end != off:
        raise WireError(f"{opcode.name} carries no payload, got {end - off} bytes")
    if layout == _L_ATOMIC:
        atomic_eth = _new_packet(AtomicETH, _ATOMIC_ETH.unpack_from(mv, BTH_LEN))
        return _new_packet(Packet, (opcode, qp, psn, ackreq, se, migreq, pkey, fecn, becn,
                                    None, None, atomic_eth, None, None, None, mv[off:end]))  # fmt: skip
    # _L_ATOMIC_ACK
    w, atomic_ack = _S_ATOMIC_ACK.unpack_from(mv, 0)[5:]
    aeth = _new_packet(AETH, (w >> 24, w & _U24))
    return _new_packet(Packet, (opcode, qp, psn, ackreq, se, migreq, pkey, fecn, becn,
                                None, aeth, None, atomic_ack, None, None, mv[off:end]))  # fmt: skip


def _byte_view(data: object) -> memoryview:
    """A flat unsigned-byte view of any buffer, or WireError."""
    try:
        mv = data if isinstance(data, memoryview) else memoryview(data)  # type: ignore[arg-type]
        if mv.format != "B" or mv.ndim != 1 or not mv.c_contiguous:
            mv = memoryview(mv.tobytes())
    except (TypeError, ValueError) as e:
        raise WireError(f"not a byte buffer: {e}") from None
    return mv
