"""RC opcodes and the headers each one carries.

Values: IBTA Vol. 1 §9.2 table 35 (Linux ``include/rdma/ib_pack.h``); header sets:
IBTA §9.2 / rxe ``rxe_opcode.c``. Bits 7:5 of an opcode select the transport;
rdmakit speaks RC (000), so the values below are the full byte.
"""

from dataclasses import dataclass
from enum import IntEnum


class Opcode(IntEnum):
    """BTH OpCode for the Reliable Connection transport (IBTA §9.2 table 35)."""

    SEND_FIRST = 0x00
    SEND_MIDDLE = 0x01
    SEND_LAST = 0x02
    SEND_LAST_WITH_IMMEDIATE = 0x03
    SEND_ONLY = 0x04
    SEND_ONLY_WITH_IMMEDIATE = 0x05
    RDMA_WRITE_FIRST = 0x06
    RDMA_WRITE_MIDDLE = 0x07
    RDMA_WRITE_LAST = 0x08
    RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09
    RDMA_WRITE_ONLY = 0x0A
    RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
    RDMA_READ_REQUEST = 0x0C
    RDMA_READ_RESPONSE_FIRST = 0x0D
    RDMA_READ_RESPONSE_MIDDLE = 0x0E
    RDMA_READ_RESPONSE_LAST = 0x0F
    RDMA_READ_RESPONSE_ONLY = 0x10
    ACKNOWLEDGE = 0x11
    ATOMIC_ACKNOWLEDGE = 0x12
    COMPARE_SWAP = 0x13
    FETCH_ADD = 0x14
    # 0x15 is reserved (IBTA §9.2 table 35).
    SEND_LAST_WITH_INVALIDATE = 0x16
    SEND_ONLY_WITH_INVALIDATE = 0x17


class Position(IntEnum):
    """Where a packet sits in its message (IBTA §9.8.3 packet sequencing)."""

    FIRST = 1
    MIDDLE = 2
    LAST = 3
    ONLY = 4


class Kind(IntEnum):
    """The operation a packet belongs to."""

    SEND = 1
    WRITE = 2
    READ_REQUEST = 3
    READ_RESPONSE = 4
    ACK = 5
    ATOMIC_ACK = 6
    ATOMIC = 7


@dataclass(frozen=True, slots=True, kw_only=True)
class OpInfo:
    """What follows the BTH for one opcode, in wire order (IBTA §9.2)."""

    opcode: Opcode
    kind: Kind
    position: Position
    reth: bool = False
    aeth: bool = False
    atomic_eth: bool = False
    atomic_ack_eth: bool = False
    imm: bool = False
    ieth: bool = False
    payload: bool = False
    #: Header bytes after the BTH (RETH 16, AETH 4, AtomicETH 28, AtomicAckETH 8,
    #: ImmDt 4, IETH 4).
    ext_len: int = 0

    @property
    def is_request(self) -> bool:
        """Sent by a requester (IBTA §9.7: requests vs responses)."""
        return self.kind in (Kind.SEND, Kind.WRITE, Kind.READ_REQUEST, Kind.ATOMIC)

    @property
    def consumes_rwqe(self) -> bool:
        """Starts a message that takes a receive WQE (rxe ``RXE_RWR_MASK``)."""
        if self.kind is Kind.SEND:
            return self.position in (Position.FIRST, Position.ONLY)
        return self.kind is Kind.WRITE and self.imm

    @property
    def starts_message(self) -> bool:
        return self.position in (Position.FIRST, Position.ONLY)

    @property
    def ends_message(self) -> bool:
        return self.position in (Position.LAST, Position.ONLY)


def _info(op: Opcode, kind: Kind, pos: Position, **hdrs: bool) -> OpInfo:
    sizes = {"reth": 16, "aeth": 4, "atomic_eth": 28, "atomic_ack_eth": 8, "imm": 4, "ieth": 4}
    ext = sum(sizes[h] for h, on in hdrs.items() if on and h in sizes)
    return OpInfo(opcode=op, kind=kind, position=pos, ext_len=ext, **hdrs)


_F, _M, _L, _O = Position.FIRST, Position.MIDDLE, Position.LAST, Position.ONLY
_O_ = Opcode

#: Opcode -> header set. An opcode missing here is not an RC opcode rdmakit knows.
OPCODE_INFO: dict[int, OpInfo] = {
    i.opcode: i
    for i in (
        _info(_O_.SEND_FIRST, Kind.SEND, _F, payload=True),
        _info(_O_.SEND_MIDDLE, Kind.SEND, _M, payload=True),
        _info(_O_.SEND_LAST, Kind.SEND, _L, payload=True),
        _info(_O_.SEND_LAST_WITH_IMMEDIATE, Kind.SEND, _L, imm=True, payload=True),
        _info(_O_.SEND_ONLY, Kind.SEND, _O, payload=True),
        _info(_O_.SEND_ONLY_WITH_IMMEDIATE, Kind.SEND, _O, imm=True, payload=True),
        _info(_O_.RDMA_WRITE_FIRST, Kind.WRITE, _F, reth=True, payload=True),
        _info(_O_.RDMA_WRITE_MIDDLE, Kind.WRITE, _M, payload=True),
        _info(_O_.RDMA_WRITE_LAST, Kind.WRITE, _L, payload=True),
        _info(_O_.RDMA_WRITE_LAST_WITH_IMMEDIATE, Kind.WRITE, _L, imm=True, payload=True),
        _info(_O_.RDMA_WRITE_ONLY, Kind.WRITE, _O, reth=True, payload=True),
        _info(_O_.RDMA_WRITE_ONLY_WITH_IMMEDIATE, Kind.WRITE, _O, reth=True, imm=True, payload=True),
        _info(_O_.RDMA_READ_REQUEST, Kind.READ_REQUEST, _O, reth=True),
        _info(_O_.RDMA_READ_RESPONSE_FIRST, Kind.READ_RESPONSE, _F, aeth=True, payload=True),
        _info(_O_.RDMA_READ_RESPONSE_MIDDLE, Kind.READ_RESPONSE, _M, payload=True),
        _info(_O_.RDMA_READ_RESPONSE_LAST, Kind.READ_RESPONSE, _L, aeth=True, payload=True),
        _info(_O_.RDMA_READ_RESPONSE_ONLY, Kind.READ_RESPONSE, _O, aeth=True, payload=True),
        _info(_O_.ACKNOWLEDGE, Kind.ACK, _O, aeth=True),
        _info(_O_.ATOMIC_ACKNOWLEDGE, Kind.ATOMIC_ACK, _O, aeth=True, atomic_ack_eth=True),
        _info(_O_.COMPARE_SWAP, Kind.ATOMIC, _O, atomic_eth=True),
        _info(_O_.FETCH_ADD, Kind.ATOMIC, _O, atomic_eth=True),
        _info(_O_.SEND_LAST_WITH_INVALIDATE, Kind.SEND, _L, ieth=True, payload=True),
        _info(_O_.SEND_ONLY_WITH_INVALIDATE, Kind.SEND, _O, ieth=True, payload=True),
    )
}

#: Opcodes of MIDDLE packets: BTH only, a payload of exactly one MTU (IBTA §9.8.3.1);
#: the bulk of a long message, which fast paths and native data planes take.
MIDDLE_OPCODES: frozenset[Opcode] = frozenset(
    Opcode(op) for op, i in OPCODE_INFO.items() if i.position is Position.MIDDLE
)
