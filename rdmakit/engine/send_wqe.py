"""A send work request as the requester tracks it (rxe ``struct rxe_send_wqe``).

What answers it (``WqeKind``), how far it got (``WqeState``), the opcodes its
packets carry (rxe ``next_opcode_rc()``) and its progress: the PSN range it
occupies, the bytes of a READ placed so far and whether it holds one of the
``max_rd_atomic`` slots. :mod:`.requester` sends them and :mod:`.completer`
completes them.
"""

from enum import IntEnum

from rdmakit.wire import Opcode

from .types import SendWR, WcOpcode, WcStatus, WrOpcode


class WqeKind(IntEnum):
    """What answers a send WQE (rxe ``wr_opcode_mask()``; IBTA §9.7.5.1)."""

    SEND_WRITE = 0  # WR_SEND_MASK / WR_WRITE_MASK: ACKs, cumulative (§9.7.5.1.1)
    READ = 1  # WR_READ_MASK: RDMA READ responses (§9.7.5.1.3)
    ATOMIC = 2  # WR_ATOMIC_MASK: an ATOMIC ACKNOWLEDGE (§9.7.5.1.2)


class WqeState(IntEnum):
    """A send WQE's progress (rxe ``enum wqe_state``)."""

    POSTED = 0  # wqe_state_posted: not (re)started since the last rewind
    PROCESSING = 1  # wqe_state_processing: some packets sent
    PENDING = 2  # wqe_state_pending: wholly sent, waiting for its response


SEND_WRITE, READ, ATOMIC = WqeKind
POSTED, PROCESSING, PENDING = WqeState

_O = Opcode
#: WrOpcode -> (MIDDLE, LAST, FIRST, ONLY), indexed by ``first << 1 | last``
#: (rxe ``next_opcode_rc()``).
_SEGMENT_OPS: dict[WrOpcode, tuple[Opcode, Opcode, Opcode, Opcode]] = {
    WrOpcode.SEND: (_O.SEND_MIDDLE, _O.SEND_LAST, _O.SEND_FIRST, _O.SEND_ONLY),
    WrOpcode.SEND_WITH_IMM: (
        _O.SEND_MIDDLE, _O.SEND_LAST_WITH_IMMEDIATE, _O.SEND_FIRST, _O.SEND_ONLY_WITH_IMMEDIATE,
    ),
    WrOpcode.RDMA_WRITE: (
        _O.RDMA_WRITE_MIDDLE, _O.RDMA_WRITE_LAST, _O.RDMA_WRITE_FIRST, _O.RDMA_WRITE_ONLY,
    ),
    WrOpcode.RDMA_WRITE_WITH_IMM: (
        _O.RDMA_WRITE_MIDDLE, _O.RDMA_WRITE_LAST_WITH_IMMEDIATE, _O.RDMA_WRITE_FIRST,
        _O.RDMA_WRITE_ONLY_WITH_IMMEDIATE,
    ),
}  # fmt: skip

#: Send opcodes whose message takes a receive WQE at the responder (IBTA §9.7.7.2).
_TAKES_RECEIVE = frozenset((WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM))

WC_OPCODE = {
    WrOpcode.SEND: WcOpcode.SEND,
    WrOpcode.SEND_WITH_IMM: WcOpcode.SEND,
    WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
    WrOpcode.ATOMIC_CMP_AND_SWP: WcOpcode.COMP_SWAP,
    WrOpcode.ATOMIC_FETCH_AND_ADD: WcOpcode.FETCH_ADD,
}


class SendWqe:
    """One posted send work request and its progress."""

    __slots__ = (
        "first_psn",
        "has_rd",
        "imm",
        "is_write",
        "kind",
        "last_psn",
        "length",
        "ops",
        "read_done",
        "seg0",
        "segs",
        "signaled",
        "solicited",
        "started",
        "state",
        "status",
        "takes_receive",
        "wc_opcode",
        "wr",
    )  # fmt: skip

    def __init__(
        self, wr: SendWR, opcode: WrOpcode, length: int, segs: list[memoryview], status: WcStatus
    ) -> None:
        self.wr = wr
        self.length = length
        self.segs = segs
        #: The one segment when there is exactly one (the zero-copy fast path).
        self.seg0 = segs[0] if len(segs) == 1 else None
        #: SUCCESS, or the local error this WQE completes with once it is the head.
        self.status = status
        self.signaled = wr.signaled
        self.wc_opcode = WC_OPCODE[opcode]
        if opcode is WrOpcode.RDMA_READ:
            self.kind = READ
        elif opcode in (WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD):
            self.kind = ATOMIC
        else:
            self.kind = SEND_WRITE
        self.ops = _SEGMENT_OPS.get(opcode)
        self.is_write = opcode in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)
        #: ImmDt for the last packet; verbs ignores imm_data on other opcodes.
        self.imm = wr.imm_data if opcode in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM) else None
        #: Takes a receive WQE at the responder: SEND, or WRITE with immediate (IBTA §9.7.7.2).
        self.takes_receive = opcode in _TAKES_RECEIVE
        #: SE on the last packet: IBV_SEND_SOLICITED, for the opcodes it applies to (IBTA §9.2
        #: BTH SE; rxe_req.c init_req_packet()).
        self.solicited = wr.solicited and self.takes_receive
        self.state = POSTED
        self.started = False
        self.first_psn = 0
        self.last_psn = 0
        #: Holds one of the max_rd_atomic slots (rxe ``has_rd_atomic``).
        self.has_rd = False
        #: READ: bytes of response data placed so far.
        self.read_done = 0
