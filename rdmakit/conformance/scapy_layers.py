"""The RC extension headers scapy's ``contrib/roce.py`` lacks.

scapy ships BTH and AETH (bound to ACKNOWLEDGE only). These layers add RETH,
AtomicETH, AtomicAckETH, ImmDt and IETH, written from their IBTA Vol. 1
definitions (§9.3.3-§9.3.6 and §9.4, field names as in the spec), and bind
them, and AETH, to every RC opcode that carries them (IBTA §9.2 table 35).
The conformance suite builds and dissects its packets with these layers, so
that its encoder shares no code with ``rdmakit.wire``. scapy (GPL) is only
imported, never vendored: it is the optional ``conformance`` extra.
"""

from scapy.contrib.roce import AETH, BTH
from scapy.fields import IntField, XIntField, XLongField
from scapy.packet import Packet, Raw, bind_layers

# RC opcode values (IBTA §9.2 table 35), spelled out here rather than taken from
# rdmakit so that the oracle does not share the code under test.
SEND_LAST_WITH_IMMEDIATE = 0x03
SEND_ONLY_WITH_IMMEDIATE = 0x05
RDMA_WRITE_FIRST = 0x06
RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09
RDMA_WRITE_ONLY = 0x0A
RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
RDMA_READ_REQUEST = 0x0C
RDMA_READ_RESPONSE_FIRST = 0x0D
RDMA_READ_RESPONSE_LAST = 0x0F
RDMA_READ_RESPONSE_ONLY = 0x10
ACKNOWLEDGE = 0x11
ATOMIC_ACKNOWLEDGE = 0x12
COMPARE_SWAP = 0x13
FETCH_ADD = 0x14
SEND_LAST_WITH_INVALIDATE = 0x16
SEND_ONLY_WITH_INVALIDATE = 0x17


def _bth_opcode(layer: Packet) -> int | None:
    """The opcode of the BTH below ``layer`` (extension headers chain on it)."""
    under = layer.underlayer
    while under is not None and not isinstance(under, BTH):
        under = under.underlayer
    return None if under is None else int(under.opcode)


class RETH(Packet):
    """RDMA Extended Transport Header (IBTA §9.3.3): VA, R_Key, DMA Length."""

    name = "RETH"
    fields_desc = [  # noqa: RUF012 (scapy's declarative layer API)
        XLongField("va", 0),
        XIntField("rkey", 0),
        IntField("dlen", 0),
    ]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        # RDMA WRITE Only with Immediate: RETH, then ImmDt (IBTA §9.2 table 35).
        if _bth_opcode(self) == RDMA_WRITE_ONLY_WITH_IMMEDIATE:
            return ImmDt
        return Raw


class AtomicETH(Packet):
    """Atomic Extended Transport Header (IBTA §9.3.4): VA, R_Key, SwapDt, CmpDt.

    The Swap (or Add) Data field precedes the Compare Data field on the wire.
    """

    name = "AtomicETH"
    fields_desc = [  # noqa: RUF012
        XLongField("va", 0),
        XIntField("rkey", 0),
        XLongField("swapdt", 0),
        XLongField("cmpdt", 0),
    ]


class AtomicAckETH(Packet):
    """Atomic Acknowledge Extended Transport Header (IBTA §9.3.6): OrigRemDt."""

    name = "AtomicAckETH"
    fields_desc = [XLongField("origremdt", 0)]  # noqa: RUF012


class ImmDt(Packet):
    """Immediate Data Extended Transport Header (IBTA Vol. 1 §9.3): 4 opaque bytes."""

    name = "ImmDt"
    fields_desc = [XIntField("immdt", 0)]  # noqa: RUF012


class IETH(Packet):
    """Invalidate Extended Transport Header (IBTA Vol. 1 §9.3): the R_Key to invalidate."""

    name = "IETH"
    fields_desc = [XIntField("rkey", 0)]  # noqa: RUF012


class RcAETH(AETH):
    """scapy's AETH (syndrome, MSN) where the BTH opcode is not ACKNOWLEDGE.

    scapy binds its AETH to ACKNOWLEDGE only; this subclass carries the same
    fields for RDMA READ responses and ATOMIC ACKNOWLEDGE, and chains to the
    AtomicAckETH on the latter. ``pkt[AETH]`` finds it too.
    """

    match_subclass = True

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        if _bth_opcode(self) == ATOMIC_ACKNOWLEDGE:
            return AtomicAckETH
        return Raw


for _op in (RDMA_WRITE_FIRST, RDMA_WRITE_ONLY, RDMA_WRITE_ONLY_WITH_IMMEDIATE, RDMA_READ_REQUEST):
    bind_layers(BTH, RETH, opcode=_op)
for _op in (RDMA_READ_RESPONSE_FIRST, RDMA_READ_RESPONSE_LAST, RDMA_READ_RESPONSE_ONLY, ATOMIC_ACKNOWLEDGE):
    bind_layers(BTH, RcAETH, opcode=_op)
for _op in (COMPARE_SWAP, FETCH_ADD):
    bind_layers(BTH, AtomicETH, opcode=_op)
for _op in (SEND_LAST_WITH_IMMEDIATE, SEND_ONLY_WITH_IMMEDIATE, RDMA_WRITE_LAST_WITH_IMMEDIATE):
    bind_layers(BTH, ImmDt, opcode=_op)
for _op in (SEND_LAST_WITH_INVALIDATE, SEND_ONLY_WITH_INVALIDATE):
    bind_layers(BTH, IETH, opcode=_op)

__all__ = ["AETH", "BTH", "IETH", "RETH", "AtomicAckETH", "AtomicETH", "ImmDt", "RcAETH"]
