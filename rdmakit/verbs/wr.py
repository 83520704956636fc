"""Work requests and completions between the engine's value types and libibverbs': pure.

Two things need care:

- **Immediate data.** ``ibv_send_wr.imm_data`` and ``ibv_wc.imm_data`` are
  ``__be32``: the four bytes in memory are the wire bytes. pyverbs reads and
  writes them as a host-order ``uint32``. The engine's ``imm_data`` is the
  wire value read big-endian, so on a little-endian host the two differ by a
  byte swap (`imm_to_verbs`, `imm_from_verbs`).
- **Completions of failed work requests.** verbs leaves ``ibv_wc.opcode``
  undefined when the status is not success (rxe leaves it 0 on flushed
  receives), but the engine's `Completion` names the work request's
  operation. So the backend posts every work request under an internal
  ``wr_id`` and `WrTracker` maps completions back to the caller's ``wr_id`` and
  operation. An RC send queue completes in posting order, so an unsignaled
  request is known to be done once a later one completes.
"""

import sys
from collections import deque
from dataclasses import dataclass
from typing import Literal, Protocol

from rdmakit.engine.types import Completion, SendWR, WcOpcode, WcStatus, WrOpcode

__all__ = [
    "SEND_SIGNALED",
    "SEND_SOLICITED",
    "SRQ_FIRST_ID",
    "WC_WITH_IMM",
    "Posted",
    "WrTracker",
    "imm_from_verbs",
    "imm_to_verbs",
    "wc_opcode_for",
]

#: The first internal ``wr_id`` of a shared receive queue's receives (a QP's count up from 1).
SRQ_FIRST_ID = 1 << 62
#: ``IBV_SEND_SIGNALED`` (``enum ibv_send_flags``).
SEND_SIGNALED = 1 << 1
#: ``IBV_SEND_SOLICITED`` (``enum ibv_send_flags``).
SEND_SOLICITED = 1 << 2
#: ``IBV_WC_WITH_IMM`` (``enum ibv_wc_flags``): ``imm_data`` is valid.
WC_WITH_IMM = 1 << 1

_WC_FOR_WR = {
    WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE,
    WrOpcode.SEND: WcOpcode.SEND,
    WrOpcode.SEND_WITH_IMM: WcOpcode.SEND,
    WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
    WrOpcode.ATOMIC_CMP_AND_SWP: WcOpcode.COMP_SWAP,
    WrOpcode.ATOMIC_FETCH_AND_ADD: WcOpcode.FETCH_ADD,
}
_WITH_IMM = frozenset({WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM})
Byteorder = Literal["little", "big"]
#: Completions that carry the ImmDt; rxe also flags a requester's *_WITH_IMM completion
#: with IBV_WC_WITH_IMM but leaves ``imm_data`` 0 (``rxe_comp.c`` ``make_send_cqe``).
_RECV_OPS = frozenset({WcOpcode.RECV, WcOpcode.RECV_RDMA_WITH_IMM})


def wc_opcode_for(opcode: WrOpcode) -> WcOpcode:
    """The requester's completion opcode for a send work request (``ibv_wc_opcode``)."""
    return _WC_FOR_WR[opcode]


def needs_imm(opcode: WrOpcode) -> bool:
    return opcode in _WITH_IMM


def imm_to_verbs(imm: int, byteorder: Byteorder = sys.byteorder) -> int:
    """The engine's ImmDt (the wire u32, big-endian) -> the ``uint32`` pyverbs stores."""
    return int.from_bytes((imm & 0xFFFF_FFFF).to_bytes(4, "big"), byteorder)


def imm_from_verbs(raw: int, byteorder: Byteorder = sys.byteorder) -> int:
    """The ``uint32`` pyverbs reads from ``ibv_wc.imm_data`` -> the engine's ImmDt."""
    return int.from_bytes((raw & 0xFFFF_FFFF).to_bytes(4, byteorder), "big")


@dataclass(frozen=True, slots=True)
class Posted:
    """A work request as posted: the caller's ``wr_id`` and the operation it completes as."""

    wr_id: int
    opcode: WcOpcode
    send: bool


class _WC(Protocol):
    """The fields of an ``ibv_wc`` as pyverbs' ``WC`` has them."""

    wr_id: int
    status: int
    opcode: int
    byte_len: int
    imm_data: int
    wc_flags: int
    qp_num: int
    src_qp: int
    vendor_err: int


class WrTracker:
    """Internal ``wr_id`` s for posted work requests, and completions mapped back.

    Internal ids count up from `first_id` (1). Receives always complete
    (``ibv_recv_wr`` has no unsignaled form); sends complete in posting order,
    signaled or failed. A QP on a shared receive queue finds its receives in
    the SRQ's tracker (`shared`), whose ids start at `SRQ_FIRST_ID`, apart
    from any QP's.
    """

    def __init__(self, first_id: int = 1, shared: "WrTracker | None" = None) -> None:
        self._next = first_id
        self._shared = shared
        self._sends: deque[tuple[int, Posted]] = deque()
        self._recvs: dict[int, Posted] = {}

    def __len__(self) -> int:
        return len(self._sends) + len(self._recvs)

    def post_send(self, wr: SendWR) -> int:
        """Record `wr`; returns the internal ``wr_id`` to post it under."""
        iid = self._next
        self._next += 1
        self._sends.append((iid, Posted(wr.wr_id, wc_opcode_for(wr.opcode), True)))
        return iid

    def post_recv(self, wr_id: int) -> int:
        iid = self._next
        self._next += 1
        self._recvs[iid] = Posted(wr_id, WcOpcode.RECV, False)
        return iid

    def unpost(self, iid: int) -> None:
        """Forget `iid` (``ibv_post_*`` refused it)."""
        if self._sends and self._sends[-1][0] == iid:
            self._sends.pop()
        self._recvs.pop(iid, None)

    def complete(self, iid: int) -> Posted | None:
        """The work request internal id `iid` completed; None if it was never posted here."""
        posted = self._recvs.pop(iid, None)
        if posted is None and self._shared is not None:
            posted = self._shared._recvs.pop(iid, None)
        if posted is not None:
            return posted
        sends = self._sends
        if not any(i == iid for i, _ in sends):
            return None
        while sends:
            i, posted = sends.popleft()
            if i == iid:
                return posted
        return None  # pragma: no cover - found above

    def completion_of(self, wc: "_WC") -> Completion:
        """`completion` of a pyverbs ``WC`` (its fields read by name)."""
        return self.completion(
            wr_id=int(wc.wr_id),
            status=int(wc.status),
            opcode=int(wc.opcode),
            byte_len=int(wc.byte_len),
            imm_data=int(wc.imm_data),
            wc_flags=int(wc.wc_flags),
            qp_num=int(wc.qp_num),
            src_qp=int(wc.src_qp),
            vendor_err=int(wc.vendor_err),
        )

    def completion(
        self,
        *,
        wr_id: int,
        status: int,
        opcode: int,
        byte_len: int,
        imm_data: int,
        wc_flags: int,
        qp_num: int,
        src_qp: int,
        vendor_err: int,
        byteorder: Byteorder = sys.byteorder,
    ) -> Completion:
        """The engine `Completion` for an ``ibv_wc`` (its fields as pyverbs' ``WC`` has them)."""
        posted = self.complete(wr_id)
        st = WcStatus(status) if status in WcStatus._value2member_map_ else WcStatus.GENERAL_ERR
        if st is WcStatus.SUCCESS and opcode in WcOpcode._value2member_map_:
            op = WcOpcode(opcode)
        elif posted is not None:
            op = posted.opcode
        else:
            op = WcOpcode.RECV
        return Completion(
            wr_id=posted.wr_id if posted is not None else wr_id,
            status=st,
            opcode=op,
            byte_len=byte_len,
            imm_data=imm_from_verbs(imm_data, byteorder)
            if wc_flags & WC_WITH_IMM and op in _RECV_OPS
            else None,
            qp_num=qp_num,
            src_qp=src_qp,
            vendor_err=vendor_err,
        )
