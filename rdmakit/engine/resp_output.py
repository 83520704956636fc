"""The responder's output: ACK/NAK coalescing and READ response generation.

Responses leave in request order through ``out`` (IBTA §9.7.5.1.2: a
responder answers in PSN order): ACK, NAK and ATOMIC ACKNOWLEDGE packets,
and ``ReadReply`` cursors that ``transmit`` turns into READ response packets
lazily (payloads are zero-copy slices of the registered memory, read when the
transport encodes them; rxe ``read_reply()``). Plain ACKs waiting in ``out``
are cumulative (IBTA §9.7.5.1.1), so a newer one replaces an older one queued
behind the same responses.
"""

from collections import deque
from typing import Any, TypeGuard

from rdmakit.wire import (
    AETH,
    CREDITS_UNLIMITED,
    PSN_MASK,
    NakCode,
    Opcode,
    Packet,
    Train,
    ack_syndrome,
    nak_syndrome,
    psn_diff,
)

from .congestion import PACKET_OVERHEAD, Dcqcn, ResponsePacer, paced
from .context import QpContext
from .credits import advertised

_MASK = PSN_MASK
#: Syndromes below this are of kind ACK (IBTA §9.7.5.1 table 44: bits 7:5 are 000).
_RNR_KIND = ack_syndrome(0) + 0x20


def _coalescing(prev: object) -> TypeGuard[Packet]:
    """``prev`` (the last response queued) is an ACK that a later ACK replaces (not a NAK)."""
    if type(prev) is Packet and prev.opcode is Opcode.ACKNOWLEDGE:
        aeth = prev.aeth
        return aeth is not None and aeth.syndrome < _RNR_KIND
    return False


_RR_MIDDLE = Opcode.RDMA_READ_RESPONSE_MIDDLE
_new_packet = tuple.__new__
#: Responses waiting to be sent beyond which new ones are dropped (a peer
#: flooding duplicates cannot grow memory without bound; it will retry).
MAX_QUEUED_RESPONSES = 1024


class ReadReply:
    """READ response packets still to send for one (possibly replayed) READ."""

    __slots__ = ("msn", "new", "off", "psn", "resid", "view")

    def __init__(self, view: memoryview | None, length: int, psn: int, new: bool, msn: int) -> None:
        self.view = view
        self.off = 0
        self.resid = length
        self.psn = psn
        #: Start with FIRST/ONLY (a new request) rather than MIDDLE/LAST (a replay
        #: from inside the range, rxe ``rdatm_res_state_replay``).
        self.new = new
        self.msn = msn


class ResponseOutput:
    """The output half of the ``Responder`` (its base class)."""

    __slots__ = ("pace_deadline", "pacer")
    qp: QpContext
    out: deque[Packet | ReadReply]
    rq: deque[Any]
    srq: Any
    msn: int
    mtu: int
    fast: bool
    #: Responses wait for their pace once READ responses were lost (None: not yet, or off).
    pacer: ResponsePacer | None
    #: While the pacer holds the next response back: when it may leave.
    pace_deadline: float | None

    def _queue(self, pkt: Packet) -> None:
        out = self.out
        if len(out) >= MAX_QUEUED_RESPONSES:
            self.qp.stats.drop("response_queue_full")
            return
        out.append(pkt)

    def queue_ack(self, psn: int) -> None:
        out = self.out
        if out and _coalescing(prev := out[-1]):
            if psn_diff(psn, prev.psn) >= 0:
                out[-1] = self._ack(Opcode.ACKNOWLEDGE, psn, self.credit_syndrome())
            return
        self._queue(self._ack(Opcode.ACKNOWLEDGE, psn, self.credit_syndrome()))

    def held_ack(self) -> tuple[int, int, int] | None:
        """The ACK ``queue_ack`` would coalesce into, when it is all that is queued:
        (PSN, syndrome, MSN); None otherwise."""
        out = self.out
        if len(out) == 1 and _coalescing(prev := out[0]):
            aeth = prev.aeth
            assert aeth is not None
            return prev.psn, aeth.syndrome, aeth.msn
        return None

    def credit_syndrome(self) -> int:
        """An ACK's syndrome: kind ACK, the receive WQEs left as a credit code (IBTA §9.7.7.2).

        A QP that takes its receives from a shared receive queue has none of its own to
        count: the queue's WQEs are every attached QP's, so it advertises "invalid" (0x1F),
        no end-to-end flow control (IBTA §10.2.9; rdmavt ``rvt_compute_aeth`` does the same)."""
        if self.srq is not None:
            return CREDITS_UNLIMITED
        return advertised(len(self.rq))

    def _ack(self, op: Opcode, psn: int, syndrome: int, orig: int | None = None) -> Packet:
        return Packet(
            op, self.qp.dest_qpn, psn, False, False, False, 0xFFFF, False, False, None,
            AETH(syndrome, self.msn), None, orig,
        )  # fmt: skip

    def queue_nak(self, code: NakCode, psn: int) -> None:
        self.qp.stats.count_nak_sent(code)
        self._queue(self._ack(Opcode.ACKNOWLEDGE, psn, nak_syndrome(code)))

    def paced_transmit(
        self, out: list[Packet | Train], budget: int, now: float, trains: bool, rate: Dcqcn
    ) -> int:
        """``transmit``, at the pace once READ responses were lost (``ResponsePacer``) and at
        the QP's DCQCN ``rate``: the QP is DCQCN's reaction point for all the data it sends
        (Zhu et al. 2015, §3.1), so a CNP for READ responses that arrived marked CE lowers
        their rate too."""
        pacer = self.pacer
        if pacer is None or self.held_ack() is not None:
            # One ACK alone (what a native owner of the responder holds, too) is not the data
            # the pace and DCQCN's rate meter: it leaves at once, and is not measured.
            return self.transmit(out, budget, trains)
        if self.pace_deadline is not None:
            return 0
        size = self.mtu + PACKET_OVERHEAD
        pacer.pace(size, now)
        if pacer.rate is not None or rate.rate is not None:
            budget, deadline = paced(rate, pacer, now, size, budget)
            if not budget:
                self.pace_deadline = deadline
                return 0
        n = self.transmit(out, budget, trains)
        pacer.measure(n * size, now, bool(self.out))
        rate.sent(n * size, now)
        return n

    def unpaced(self, rate: Dcqcn) -> bool:
        """``paced_transmit`` would send all that is queued now, holding nothing back: no pace
        yet (``ResponsePacer.pace`` leaves its rate None) and no DCQCN rate."""
        pacer = self.pacer
        if pacer is None:
            return True
        return self.pace_deadline is None and not (pacer.armed and pacer.best) and rate.rate is None

    def sent_natively(self, n: int, now: float, rate: Dcqcn) -> None:
        """``n`` responses (a native owner's READ responses, with the ACK queued before them) left
        now, while ``unpaced``: ``paced_transmit``'s bookkeeping of them."""
        pacer = self.pacer
        if pacer is None:
            return
        size = self.mtu + PACKET_OVERHEAD
        pacer.pace(size, now)
        pacer.measure(n * size, now, bool(self.out))
        rate.sent(n * size, now)

    def transmit(self, out: list[Packet | Train], budget: int, trains: bool = False) -> int:
        """Append up to ``budget`` response packets to ``out`` (runs of READ response
        MIDDLE packets as one ``Train`` each with ``trains``); return how many."""
        q = self.out
        n = 0
        dqpn = self.qp.dest_qpn
        mtu = self.mtu
        while q and n < budget:
            item = q[0]
            if type(item) is Packet:
                q.popleft()
                out.append(item)
                n += 1
                continue
            assert isinstance(item, ReadReply)
            view = item.view
            while n < budget:
                if not item.new and view is not None and item.resid > mtu and self.fast:
                    # A run of MIDDLE responses (no AETH): only the PSN and
                    # the payload slice change. Same packets as the step below.
                    off, resid, psn = item.off, item.resid, item.psn
                    if trains:
                        m = min(budget - n, (resid - 1) // mtu)
                        out.append(Train(_RR_MIDDLE, dqpn, psn, m, view[off : off + m * mtu], mtu))
                        n += m
                        off += m * mtu
                        resid -= m * mtu
                        psn = (psn + m) & _MASK
                    while n < budget and resid > mtu:
                        out.append(_new_packet(Packet, (
                            _RR_MIDDLE, dqpn, psn, False, False, False, 0xFFFF, False, False,
                            None, None, None, None, None, None, view[off : off + mtu],
                        )))  # fmt: skip
                        n += 1
                        off += mtu
                        resid -= mtu
                        psn = (psn + 1) & _MASK
                    item.off, item.resid, item.psn = off, resid, psn
                    if n >= budget:
                        break
                resid = item.resid
                last = resid <= mtu
                size = resid if last else mtu
                if item.new:
                    item.new = False
                    op = Opcode.RDMA_READ_RESPONSE_ONLY if last else Opcode.RDMA_READ_RESPONSE_FIRST
                else:
                    op = Opcode.RDMA_READ_RESPONSE_LAST if last else Opcode.RDMA_READ_RESPONSE_MIDDLE
                off = item.off
                payload = view[off : off + size] if size and view is not None else b""
                aeth = None if op is _RR_MIDDLE else AETH(self.credit_syndrome(), item.msn)
                pkt = Packet(
                    op, dqpn, item.psn, False, False, False, 0xFFFF, False, False, None, aeth, None,
                    None, None, None, payload,
                )  # fmt: skip
                out.append(pkt)
                n += 1
                item.off = off + size
                item.resid = resid - size
                item.psn = (item.psn + 1) & _MASK
                if last:
                    q.popleft()
                    break
        return n

    def queue_read(self, view: memoryview | None, length: int, psn: int, new: bool) -> None:
        """Queue the READ response packets of ``length`` bytes from ``view`` starting at ``psn``."""
        if len(self.out) >= MAX_QUEUED_RESPONSES:
            self.qp.stats.drop("response_queue_full")
            return
        self.out.append(ReadReply(view, length, psn, new, self.msn))
