"""End-to-end flow control credits (IBTA Vol. 1 §9.7.7.2): both ends of an RC QP.

The responder advertises, in the AETH of every ACK-kind response (ACK, ATOMIC
ACKNOWLEDGE, the READ responses that carry an AETH), how many receive WQEs it
has left, as a table 45 credit code. rxe advertises 0x1F (invalid: no
end-to-end flow control) always and its requester ignores the field
(``rxe_resp.c`` ``AETH_ACK_UNLIMITED``; ``rxe_comp.c`` reads only the syndrome's
kind); we follow the spec on both sides, as rdmavt does (``rvt_compute_aeth``,
``rvt_get_credit``).

The requester keeps a limit sequence number: ``lsn = MSN + credits`` from the
newest ACK. Messages are numbered in posting order (the SSN, 1 for the first
after RTS). A message that takes a receive WQE (SEND, RDMA WRITE with
immediate) starts only while ``ssn <= lsn + 1``: the one message past the limit
is the probe whose ACK brings new credits, so a limit never stops the requester
for ever; nor does it when nothing is outstanding (no ACK is then on its way).
A message that takes none (RDMA WRITE, READ, atomics) starts at once and moves
the limit on by one, since it moves the responder's MSN without using a
receive WQE. Until the responder's first ACK says whether it counts credits
there is no limit (rdmavt starts at zero credits instead, making the first
message a probe); once it says 0x1F it has chosen no flow control, and the
requester stops counting until the QP is reset.
"""

from rdmakit.wire import CREDIT_COUNTS, CREDITS_UNLIMITED, PSN_HALF, PSN_MASK, credit_code

#: MSNs are 24 bits and wrap like PSNs (IBTA §9.7.7.2.3).
_MASK = PSN_MASK
_HALF = PSN_HALF


def advertised(receive_wqes: int) -> int:
    """The credit code a responder with ``receive_wqes`` receive WQEs left puts in an ACK."""
    return credit_code(receive_wqes)


class RequesterCredits:
    """The requester's limit on messages that take a receive WQE at the responder."""

    __slots__ = ("lsn", "ssn", "unlimited")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        #: The responder advertised 0x1F: no end-to-end flow control.
        self.unlimited = False
        #: The SSN of the last message started (0: none since RTS).
        self.ssn = 0
        #: The limit sequence number: the last SSN the credits cover (None: no count seen yet).
        self.lsn: int | None = None

    def may_start(self, takes_receive: bool, idle: bool = False) -> bool:
        """Whether the next message may start; if so it is counted as started.

        ``idle``: nothing is outstanding, so no ACK is on its way to bring credits; the
        message goes as a probe whatever the limit (a limit never stops it for ever).
        """
        ssn = (self.ssn + 1) & _MASK
        lsn = self.lsn
        if lsn is not None and not self.unlimited:
            if takes_receive:
                if not idle and 0 < (ssn - lsn - 1) & _MASK < _HALF:
                    return False  # past the limit and past the one probe
            else:
                self.lsn = (lsn + 1) & _MASK
        self.ssn = ssn
        return True

    def on_ack(self, code: int, msn: int) -> None:
        """An ACK-kind AETH (``code`` its low 5 bits) arrived: take the limit it sets."""
        if self.unlimited:
            return
        if code == CREDITS_UNLIMITED:
            self.unlimited = True
            return
        lsn = (msn + CREDIT_COUNTS[code]) & _MASK
        if self.lsn is None or 0 < (lsn - self.lsn) & _MASK < _HALF:
            self.lsn = lsn
