"""The completer: responses in, send completions out (rxe ``rxe_comp.c``; IBTA Vol. 1 §9.7.5).

``on_response`` is rxe's completer state machine for one packet:
``check_psn`` (cumulative completion of the WQEs the PSN passes, implied NAK
for a READ or atomic it passes, duplicates and out-of-order responses
dropped), ``check_ack`` (opcode sequence and syndrome), then READ data
placement, atomic result, ACK bookkeeping, RNR and NAK handling.

Where rxe would complete a WQE with a malformed response (a READ response
with a NAK syndrome, a middle response with no first, a response whose
length doesn't fit), we drop the packet and count it: the retry timer
recovers, and a live QP survives garbage. A response of the wrong kind for
the WQE it answers completes it with BAD_RESP_ERR (IBTA §10.10.2; rxe says
FATAL_ERR) and the QP moves to the error state.
"""

import sys

from rdmakit.wire import (
    PSN_HALF,
    PSN_MASK,
    AckKind,
    NakCode,
    Opcode,
    OpInfo,
    Packet,
    Payload,
    Position,
    psn_diff,
)

from .context import QpContext
from .memory import scatter
from .requester import Requester
from .send_wqe import ATOMIC, POSTED, READ, SEND_WRITE, SendWqe
from .types import WcStatus

_MASK = PSN_MASK
_HALF = PSN_HALF
_BYTEORDER = sys.byteorder

_FIRST, _MIDDLE, _LAST, _ONLY = Position.FIRST, Position.MIDDLE, Position.LAST, Position.ONLY
_RR_FIRST = Opcode.RDMA_READ_RESPONSE_FIRST
_RR_MIDDLE = Opcode.RDMA_READ_RESPONSE_MIDDLE
_RR_LAST = Opcode.RDMA_READ_RESPONSE_LAST
_RR_ONLY = Opcode.RDMA_READ_RESPONSE_ONLY
_ACK = Opcode.ACKNOWLEDGE
_ATOMIC_ACK = Opcode.ATOMIC_ACKNOWLEDGE

#: NAK code -> the requester's completion status (rxe ``check_ack()``).
NAK_STATUS = {
    NakCode.INVALID_REQUEST: WcStatus.REM_INV_REQ_ERR,
    NakCode.REMOTE_ACCESS_ERROR: WcStatus.REM_ACCESS_ERR,
    NakCode.REMOTE_OPERATIONAL_ERROR: WcStatus.REM_OP_ERR,
}


def _middle_read(req: Requester) -> SendWqe | None:
    """The READ at the SQ head, if its next response may be an in-order MIDDLE to place."""
    sq = req.sq
    if not sq or req.comp_opcode is None:
        return None
    wqe = sq[0]
    if wqe.kind != READ or wqe.state == POSTED:
        return None
    psn = req.comp_psn
    if (psn - req.sent_hwm) & _MASK < _HALF or 0 < (psn - wqe.last_psn) & _MASK < _HALF:
        return None
    return wqe


def fast_read_middle(req: Requester, psn: int, payload: Payload, now: float) -> bool:
    """Place an in-order READ RESPONSE MIDDLE packet of the READ at the head of the SQ.

    Does exactly what ``on_response`` does for such a packet, without the
    generic dispatch. Returns False, having done nothing, for any packet that
    needs more than that (a gap, an implied NAK, a bad length, ...): the
    caller then takes the generic path.
    """
    if psn != req.comp_psn:
        return False
    wqe = _middle_read(req)
    if wqe is None:
        return False
    plen = len(payload)
    done = wqe.read_done
    if plen != req.mtu or wqe.length - done <= plen:
        return False
    seg0 = wqe.seg0
    if seg0 is not None:
        seg0[done : done + plen] = payload
    else:
        scatter(wqe.segs, done, payload)
    read_run_done(req, 1, now)
    return True


def read_run(req: Requester) -> tuple[int, memoryview, int, int, int] | None:
    """Where a run of in-order READ RESPONSE MIDDLE packets would go (see ``QueuePair.rx_run``).

    ``fast_read_middle``'s conditions for every packet of the run; the READ's
    local memory must be one buffer.
    """
    wqe = _middle_read(req)
    if wqe is None or wqe.seg0 is None:
        return None
    mtu = req.mtu
    done = wqe.read_done
    most = (wqe.length - done - 1) // mtu
    if most <= 0:
        return None
    return req.comp_psn, wqe.seg0, done, most, mtu


def read_run_done(req: Requester, count: int, now: float) -> None:
    """``count`` MIDDLE packets of the head READ placed, in order."""
    req.reset_retry_counters()
    req.sq[0].read_done += count * req.mtu
    req.comp_psn = (req.comp_psn + count) & _MASK
    req.comp_opcode = _RR_MIDDLE
    req.restart_timer(now)


def on_response(qp: QpContext, req: Requester, pkt: Packet, info: OpInfo, now: float) -> None:
    """Process one response packet (ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE, READ responses)."""
    stats = qp.stats
    sq = req.sq
    psn = pkt.psn
    if (psn - req.sent_hwm) & _MASK < _HALF:
        stats.drop("response_for_unsent_psn")
        return
    aeth = pkt.aeth
    if aeth is not None and aeth.syndrome < 0x20:  # ACK kind: its low bits are a credit count
        req.credits.on_ack(aeth.syndrome, aeth.msn)
    # check_psn: complete every SEND/WRITE the PSN passes (a cumulative ACK).
    while True:
        if not sq:
            stats.drop("unexpected_response")
            return
        wqe = sq[0]
        if wqe.state == POSTED and not (
            wqe.started and wqe.kind == SEND_WRITE and (psn - wqe.last_psn) & _MASK < _HALF
        ):
            # Not (re)sent since the last rewind (rxe get_wqe(): wqe_state_posted). A SEND or
            # WRITE sent before the rewind is the exception once a cumulative ACK covers all of
            # it (IBTA §9.7.5.1.1: the ACK acknowledges every request up to its PSN): rxe resends
            # its whole window at once, while a congestion window may not have resent it yet.
            stats.drop("unexpected_response")
            return
        if not 0 < (psn - wqe.last_psn) & _MASK < _HALF:
            break
        if wqe.kind != SEND_WRITE:
            # The response to this READ/atomic was lost: the responder has
            # already answered later requests (implied NAK, IBTA §9.7.5.1.4).
            stats.implied_naks += 1
            req.error_retry(now, False)
            return
        req.reset_retry_counters()
        if psn_diff(wqe.last_psn, req.comp_psn) >= 0:
            req.comp_psn = (wqe.last_psn + 1) & _MASK
            req.comp_opcode = None
        qp.complete_send_head(WcStatus.SUCCESS)
        if qp.state_is_error():
            return
        req.restart_timer(now)
    d = (psn - req.comp_psn) & _MASK
    if d >= _HALF:
        stats.drop("duplicate_response")
        return
    kind = wqe.kind
    if d > 0 and kind != SEND_WRITE:
        stats.drop("out_of_order_response")
        if kind == READ and req.cc_on:
            # A READ response past the one expected: those between were lost (a FIFO path
            # keeps a READ's responses in order). Go back now, as a NAK-sequence error
            # would, rather than wait out the timer (rxe waits).
            req.error_retry(now, False)
        return
    op = info.opcode
    pos = info.position
    # check_ack, sequence part.
    if req.comp_opcode is None:
        if pos is not _FIRST and pos is not _ONLY:
            stats.drop("response_sequence")
            return
    elif (
        op is not _RR_MIDDLE
        and op is not _RR_LAST
        # A NAK may answer a READ retried from its middle (e.g. the MR is gone).
        and op is not _ACK
        # A retried READ may restart with FIRST at its new first PSN, or ONLY.
        and not (op is _RR_FIRST and psn == wqe.first_psn)
        and not (op is _RR_ONLY and wqe.first_psn == wqe.last_psn)
    ):
        stats.drop("response_sequence")
        return
    aeth = pkt.aeth
    if op is _ACK:
        assert aeth is not None
        syndrome = aeth.syndrome
        ack_kind = syndrome >> 5
        if ack_kind == AckKind.ACK:
            if kind != SEND_WRITE:
                # An ACK cannot answer a READ or atomic (rxe would complete it).
                stats.drop("ack_for_read_or_atomic")
                return
            acked(qp, req, psn, psn == wqe.last_psn, now)
        elif ack_kind == AckKind.RNR_NAK:
            stats.rnr_naks_received += 1
            req.rnr_nak(now, syndrome & 0x1F)
        elif ack_kind == AckKind.NAK:
            code = syndrome & 0x1F
            stats.count_nak_received(code)
            if code == NakCode.PSN_SEQUENCE_ERROR:
                # A NAK implicitly acknowledges every PSN before it.
                if d > 0:
                    req.comp_psn = psn
                    req.comp_opcode = None
                    req.restart_timer(now)
                req.error_retry(now, False, sequence=True)
            else:
                qp.fail_send(NAK_STATUS.get(code, WcStatus.REM_OP_ERR))  # type: ignore[call-overload]
        else:
            stats.drop("reserved_syndrome")
        return
    if op is _ATOMIC_ACK:
        assert aeth is not None
        if aeth.syndrome >> 5 != AckKind.ACK:
            stats.drop("bad_response_syndrome")
            return
        if kind != ATOMIC:
            qp.fail_send(WcStatus.BAD_RESP_ERR)
            return
        orig = pkt.atomic_ack
        assert orig is not None
        data = (orig & 0xFFFFFFFFFFFFFFFF).to_bytes(8, _BYTEORDER)
        seg0 = wqe.seg0
        if seg0 is not None:
            seg0[:] = data
        else:
            scatter(wqe.segs, 0, data)
        acked(qp, req, psn, True, now)
        return
    # READ responses.
    if aeth is not None and aeth.syndrome >> 5 != AckKind.ACK:
        stats.drop("bad_response_syndrome")
        return
    if kind != READ:
        qp.fail_send(WcStatus.BAD_RESP_ERR)
        return
    payload = pkt.payload
    plen = len(payload)
    done = wqe.read_done
    rest = wqe.length - done
    mtu = req.mtu
    last = pos is _LAST or pos is _ONLY
    if (plen != rest or plen > mtu) if last else (plen != mtu or rest <= mtu):
        stats.drop("bad_response_length")
        return
    if plen:
        seg0 = wqe.seg0
        if seg0 is not None:
            seg0[done : done + plen] = payload
        else:
            scatter(wqe.segs, done, payload)
        wqe.read_done = done + plen
    if last:
        acked(qp, req, psn, True, now)
    else:
        req.reset_retry_counters()
        req.comp_psn = (psn + 1) & _MASK
        req.comp_opcode = op
        req.restart_timer(now)


def acked(qp: QpContext, req: Requester, psn: int, complete: bool, now: float) -> None:
    """A response acknowledged every PSN up to ``psn``, the last of its message (an ACK, the
    last READ response or an ATOMIC ACK, its data placed): the head completes if ``complete``."""
    req.reset_retry_counters()
    req.comp_psn = (psn + 1) & _MASK
    req.comp_opcode = None
    if complete:
        qp.complete_send_head(WcStatus.SUCCESS)
    req.restart_timer(now)
