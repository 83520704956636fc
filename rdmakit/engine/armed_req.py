"""The requester's ACKs taken natively: ``QueuePair.arm_req_ticket``, ``acks_taken``.

A transport with a native data plane (``_fastpath.ArmedReq``) may retire, without
a Python call, an in-order ACKNOWLEDGE that acknowledges whole sent SEND or RDMA
WRITE WQEs at the head of the send queue (IBTA Vol. 1 §9.7.5.1.1, rxe
``rxe_comp.c``): it checks the packet as ``receive`` and ``on_response`` would,
pops the WQEs, lowers ``next_idx`` and appends their completions to the send
CQ, as ``complete_send_head`` does. What the congestion rules own (``comp_psn``,
the retry counters, the retransmit timer, the window, the RTT estimator and the
end-to-end credits) it logs, one entry per ACK, and ``acks_taken`` applies the
log with the engine's own code, in the same order as ``on_response``. The caller
hands the log over before any other call reaches the QP, so the engine's state is
never read stale. See ``docs/architecture.md``, "Who owns a QP's state".
"""

from collections.abc import Sequence
from typing import Protocol

from rdmakit.wire import IcrcFlow, Payload

from .cq import CompletionQueue
from .requester import Requester
from .stats import QpStats
from .types import Completion, WcStatus

#: One ACK taken natively: (syndrome, MSN, when, ``comp_psn`` after each WQE it completed).
AckLog = Sequence[tuple[int, int, float, tuple[int, ...]]]

#: What a native owner is made from (``_fastpath.ArmedReq``'s arguments): the QP, its
#: requester, its send CQ, the completion type, the status SUCCESS and the QPN.
ReqTicket = tuple[object, Requester, CompletionQueue, type[Completion], WcStatus, int]


class NativeRequester(Protocol):
    """What the engine asks of a native owner of its ACKs (``_fastpath.ArmedReq`` fits)."""

    def rx(self, seg: Payload, idx: int, states: dict[int, int], flow: IcrcFlow, now: float, /) -> bool:
        """Take the ACK in segment ``idx`` if it is the common case (module docstring)."""
        ...

    def take(self) -> AckLog:
        """The log since the last ``take``, emptied."""
        ...


class ArmedRequester:
    """``arm_req_ticket`` and ``acks_taken`` (a base class of ``QueuePair``)."""

    req: Requester
    stats: QpStats
    send_cq: CompletionQueue
    qpn: int
    _fast: bool
    #: The native owner of the requester's common ACKs, or None (the engine takes them).
    req_native: NativeRequester | None

    def arm_req_ticket(self) -> ReqTicket | None:
        """A native owner's arguments, when the fast paths are on; None otherwise."""
        if not self._fast:
            return None
        return self, self.req, self.send_cq, Completion, WcStatus.SUCCESS, self.qpn

    def acks_taken(self, log: AckLog) -> None:
        """The native owner took these ACKs (its WQEs popped, their completions pushed):
        ``receive``'s and ``on_response``'s effect on everything else, in their order."""
        req = self.req
        stats = self.stats
        credits = req.credits
        for syndrome, msn, now, comps in log:
            stats.packets_in += 1
            credits.on_ack(syndrome, msn)
            for comp in comps:
                # on_response's check_psn loop, then acked(): each WQE it completes.
                req.reset_retry_counters()
                req.comp_psn = comp
                req.comp_opcode = None
                req.restart_timer(now)
