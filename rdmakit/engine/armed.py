"""The responder handed to a native owner while armed: ``QueuePair.arm_ticket``, ``arm``, ``disarm``.

A transport with a native data plane (the UDP port's ``_fastpath.Armed``) may
take over a responder's steady state between messages: the expected PSN and
the MSN, with the ACK it owes. While armed, that state is the native
object's alone; it executes in-order RDMA WRITE ONLY requests (IBTA Vol. 1
§9.7.5) and holds their coalesced ACK, and the engine's copy is stale. Every
entry point of ``QueuePair`` that reads or writes the responder calls
``disarm`` first, which copies the state back exactly as
``Responder.write_only_executed`` and ``queue_ack`` would have left it (the
held ACK back in ``Responder.out``). See ``docs/architecture.md``, "Who owns a
QP's state".
"""

from typing import Protocol

from rdmakit.wire import Packet

from .memory import ProtectionDomain
from .responder import Responder
from .stats import QpStats


class NativeResponder(Protocol):
    """What the engine asks of an armed native responder (``_fastpath.Armed`` fits)."""

    @property
    def pending(self) -> bool:
        """An ACK is held (the transport sends it, or ``disarm`` hands it back)."""
        ...

    def disarm(self) -> tuple[int, int, int, int, int, int | None, int, Packet | None]:
        """The state, handed back once: (expected PSN, MSN, the last WRITE's R_Key, VA,
        length and PD generation (None: none executed), WRITEs executed, the held ACK)."""
        ...


#: What an armed responder starts from: (QPN, destination QPN, expected PSN, MSN, MTU,
#: access bits, the PD's R_Key table, ACK syndrome, the PD, the QP's counters, the ACK
#: queued and not yet sent as (PSN, syndrome, MSN), or None).
ArmTicket = tuple[
    int, int, int, int, int, int, dict[int, tuple[int, int, int, memoryview]], int, ProtectionDomain, QpStats,
    tuple[int, int, int] | None,
]  # fmt: skip


class ArmedResponder:
    """``arm_ticket``, ``arm`` and ``disarm`` (a base class of ``QueuePair``)."""

    resp: Responder
    stats: QpStats
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
        fast paths on, between messages, nothing queued to send but an ACK that a later one
        would replace (``held_ack``); None otherwise."""
        if not self._fast or not self._rx or self.native is not None:
            return None
        resp = self.resp
        held = None
        if resp.in_msg is not None or (resp.out and (held := resp.held_ack()) is None):
            return None
        return (
            self.qpn, self.dest_qpn, resp.psn, resp.msn, resp.mtu, self.access_bits,
            self.pd.remote_table, resp.credit_syndrome(), self.pd, self.stats, held,
        )  # fmt: skip

    def arm(self, owner: NativeResponder) -> None:
        """``owner`` was made from ``arm_ticket()``, just now: it owns that state from here on,
        the held ACK included."""
        self.native = owner
        self.resp.out.clear()

    def disarm(self) -> None:
        """Take the responder's state back from its native owner (nothing if none holds it)."""
        owner = self.native
        if owner is None:
            return
        self.native = None
        psn, msn, rkey, va, length, gen, executed, ack = owner.disarm()
        resp = self.resp
        if executed:
            # Responder.write_only_executed's state after the last WRITE ONLY executed.
            resp.w_view = None
            resp.w_rkey, resp.w_va = rkey, va
            assert gen is not None
            resp.w_gen = gen
            resp.w_off = resp.w_len = length
            resp.w_resid = 0
            resp.placed = None
            resp.msn = msn
            resp.psn = resp.ack_psn = psn
            resp.sent_psn_nak = False
        if ack is not None:
            resp.out.append(ack)  # queue_ack's: the output was empty when armed
