"""The responder handed to a native owner while armed: ``QueuePair.arm_ticket``, ``arm``, ``disarm``.

A transport with a native data plane (the UDP port's ``_fastpath.Armed``) may
take over a responder's steady state, between messages or within an RDMA
WRITE: the expected PSN and the MSN, the WRITE under way, with the ACK it
owes. While armed, that state is the native object's alone; it executes
in-order RDMA WRITE FIRST, MIDDLE, LAST and ONLY requests without immediate
data (IBTA Vol. 1 §9.7.5) and holds their coalesced ACK, and the in-order
RDMA READ, COMPARE SWAP and FETCH ADD request between messages when the QP
has responder resources (recording each in the engine's ring,
``RdAtomicResources.new_read`` and ``new_atomic``) and holds its READ
responses or ATOMIC ACKNOWLEDGE, and the engine's copy is stale. Every entry point of
``QueuePair`` that reads or writes the responder calls ``disarm`` first,
which copies the state back exactly as ``Responder._send_write``,
``read_executed``, ``atomic_executed`` and ``queue_ack`` would have left it
(the held ACK and the responses not yet sent back in ``Responder.out``).
See ``docs/architecture.md``, "Who owns a QP's state".
"""

from collections.abc import Callable
from typing import Protocol, cast

from rdmakit.wire import Kind, Packet

from .memory import ProtectionDomain
from .requester import Requester
from .resp_output import ReadReply
from .responder import Responder
from .stats import QpStats

#: What ``NativeResponder.disarm`` hands back.
Disarmed = tuple[int, int, bool, int, int, int, int, int, int | None, memoryview | None, int, Packet | None]
#: The READ responses a native owner still holds: (view of the READ's range or None, bytes sent,
#: bytes to send, next PSN, the next is FIRST/ONLY, MSN).
HeldReply = tuple[memoryview | None, int, int, int, bool, int]
#: What ``NativeResponder.handback`` hands back after ``disarm``: (READs and atomics executed, the
#: ACK PSN the WRITEs and atomics executed left, None if none was; the READ responses still held,
#: or the ATOMIC ACKNOWLEDGE, or None).
Handback = tuple[int, int | None, HeldReply | Packet | None]


class NativeResponder(Protocol):
    """What the engine asks of an armed native responder (``_fastpath.Armed`` fits)."""

    @property
    def pending(self) -> bool:
        """An ACK is held (the transport sends it, or ``disarm`` hands it back)."""
        ...

    def disarm(self) -> Disarmed:
        """The state, handed back once: (expected PSN, MSN, a WRITE is under way, the last
        WRITE's R_Key, VA, length, bytes placed, bytes to come and PD generation (None: none
        executed), the view of the WRITE under way (None between messages), packets
        executed, the held ACK)."""
        ...

    def allow_reads(
        self, new_read: Callable[[int, int, int, int, int], None], new_atomic: Callable[[int, int], None], /
    ) -> None:
        """Execute in-order READ and atomic requests too, recording each with ``new_read`` or
        ``new_atomic``."""
        ...

    def handback(self) -> Handback:
        """After ``disarm``: what the READs it executed left."""
        ...


#: What an armed responder starts from: (QPN, destination QPN, expected PSN, MSN, MTU,
#: access bits, the PD's R_Key table, ACK syndrome, the PD, the QP's counters, the ACK
#: queued and not yet sent as (PSN, syndrome, MSN), or None; the RDMA WRITE under way as
#: (R_Key, VA, DMA length, bytes placed, bytes to come, PD generation), or None).
ArmTicket = tuple[
    int, int, int, int, int, int, dict[int, tuple[int, int, int, memoryview]], int, ProtectionDomain, QpStats,
    tuple[int, int, int] | None, tuple[int, int, int, int, int, int] | None,
]  # fmt: skip


class ArmedResponder:
    """``arm_ticket``, ``arm`` and ``disarm`` (a base class of ``QueuePair``)."""

    resp: Responder
    stats: QpStats
    #: Its DCQCN rate is the READ responses' too (``Requester.rate``).
    req: Requester
    pd: ProtectionDomain
    access_bits: int
    qpn: int
    dest_qpn: int
    _rx: bool
    _fast: bool
    #: The armed native owner of the responder's PSN and MSN, or None (the engine owns them).
    native: NativeResponder | None

    def arm_ticket(self) -> ArmTicket | None:
        """The responder's state for a native owner, when it may take over now: receiving,
        fast paths on, between messages or within an RDMA WRITE, nothing queued to send but
        an ACK that a later one would replace (``held_ack``); None otherwise."""
        if not self._fast or not self._rx or self.native is not None:
            return None
        resp = self.resp
        held = None
        if resp.out and (held := resp.held_ack()) is None:
            return None
        msg = None
        if resp.in_msg is not None:
            if resp.in_msg is not Kind.WRITE:
                return None
            msg = (resp.w_rkey, resp.w_va, resp.w_len, resp.w_off, resp.w_resid, resp.w_gen)
        return (
            self.qpn, self.dest_qpn, resp.psn, resp.msn, resp.mtu, self.access_bits,
            self.pd.remote_table, resp.credit_syndrome(), self.pd, self.stats, held, msg,
        )  # fmt: skip

    def arm(self, owner: NativeResponder) -> None:
        """``owner`` was made from ``arm_ticket()``, just now: it owns that state from here on,
        the held ACK included."""
        self.native = owner
        self.resp.out.clear()
        if self.resp.res.ring:
            owner.allow_reads(self.resp.res.new_read, self.resp.res.new_atomic)

    def reply_unpaced(self) -> bool:
        """Responses the native owner holds may leave now as they are (``Responder.unpaced``)."""
        return self.resp.unpaced(self.req.rate)

    def reply_sent(self, n: int, now: float) -> None:
        """The native owner sent ``n`` packets now (its READ responses and the ACK before them)."""
        self.resp.sent_natively(n, now, self.req.rate)

    def disarm(self) -> None:
        """Take the responder's state back from its native owner (nothing if none holds it)."""
        owner = self.native
        if owner is None:
            return
        self.native = None
        psn, msn, in_msg, rkey, va, length, off, resid, gen, view, executed, ack = owner.disarm()
        reads, ack_psn, reply = owner.handback()
        resp = self.resp
        if reads:
            # read_executed's and atomic_executed's state (their resources are the engine's already)
            resp.in_msg = None
            resp.msn = msn
            resp.psn = psn
            if ack_psn is not None:
                resp.ack_psn = ack_psn
            resp.sent_psn_nak = False
        if executed:
            # Responder._send_write's state after the last WRITE packet executed (within a
            # message, the view of its range that the next packet writes to).
            assert gen is not None
            resp.in_msg = Kind.WRITE if in_msg else None
            resp.w_view = view
            resp.w_rkey, resp.w_va = rkey, va
            resp.w_gen = gen
            resp.w_len = length
            resp.w_off = off
            resp.w_resid = resid
            resp.placed = None
            resp.msn = msn
            resp.psn = psn
            resp.ack_psn = psn if ack_psn is None else ack_psn
            resp.sent_psn_nak = False
        if ack is not None:
            resp.out.append(ack)  # queue_ack's: the output was empty when armed
        if type(reply) is Packet:
            resp.out.append(reply)  # atomic_executed's ATOMIC ACKNOWLEDGE, behind that ACK
        elif reply is not None:
            # queue_read's, behind that ACK; the responses already sent are past
            view, sent, rest, rpsn, new, rmsn = cast(HeldReply, reply)
            rr = ReadReply(view, sent + rest, rpsn, new, rmsn)
            rr.off, rr.resid = sent, rest
            resp.out.append(rr)
