"""The requester: send queue, segmentation, PSNs, window and retry state.

Follows rxe ``rxe_req.c`` (IBTA Vol. 1 §9.7.1-§9.7.4). Work requests are
``SendWqe``s in ``Requester.sq`` in posting order; ``next_idx`` is the first
one not yet wholly sent, ``req_psn`` the next PSN to send and ``req_off`` the
bytes of ``sq[next_idx]`` already sent. Responses are handled in
:mod:`.completer`, which owns ``comp_psn`` (the oldest PSN not acknowledged)
and completes WQEs from the head of ``sq``.

Invariants:

- ``sq[:next_idx]`` were wholly sent; ``sq[next_idx:]`` were not.
- While the head WQE is sent and not complete,
  ``head.first_psn <= comp_psn <= head.last_psn`` (mod 2^24) for SEND and
  WRITE; a response PSN past ``head.last_psn`` completes it (cumulative ACK)
  or, for READ and atomics, means their response was lost (implied NAK).
- ``psn_diff(req_psn, comp_psn) < window`` before a packet is started, so at
  most ``window`` PSNs are unacknowledged (a READ's response PSNs count too;
  rxe checks only the READ's first PSN against the window, and so do we).
- Go-back-N (``rewind``) resends from ``comp_psn``: the head WQE resumes
  mid-message (SEND/WRITE at the first unacknowledged packet, READ with a new
  request for the bytes not yet received, rxe ``req_retry()``), every later
  sent WQE restarts. The PSN range a WQE occupies never changes (a retried
  READ moves ``first_psn`` up to the retry point, as rxe does).

Retries follow rxe: ``retry_cnt`` counts timeouts, NAK-sequence errors and
implied NAKs alike, 7 never runs out, and any good response restores the
count. One difference: the retransmit timer is stopped while an RNR wait runs
(rxe lets it fire, which can use up ``retry_cnt`` during a long RNR wait). With
congestion control, a tail-loss probe (:mod:`.probe`) goes before the timer.
"""

from collections import deque

from rdmakit.wire import PSN_HALF, PSN_MASK, RETH, AtomicETH, Opcode, Packet, Train

from .congestion import (
    K_MAX_RTO,
    K_MIN_RTO,
    PACKET_OVERHEAD,
    Dcqcn,
    DeliveryRate,
    Pacer,
    RttEstimator,
    Window,
    paced,
    probe_timeout,
    random_loss,
)
from .context import QpContext
from .credits import RequesterCredits
from .memory import gather
from .probe import tail_probe
from .send_wqe import PENDING, POSTED, PROCESSING, READ, SEND_WRITE, SendWqe
from .timers import INFINITE_RETRY, MAX_PKT_PER_ACK, rnr_delay, transport_timeout
from .types import WcStatus, WrOpcode

_MASK = PSN_MASK
_HALF = PSN_HALF
_new_packet = tuple.__new__
#: A timer that fired a hair before a whole local ACK timeout (floating point) still counts.
_NEARLY = 1 - 1e-9
#: AckReqs per congestion window once it is cut below rxe's spacing: acknowledgements keep a
#: small window open (RFC 5681 §4.2) and clock it smoothly. The round trip is timed from a
#: PSN's first transmission to the ACK that covers it; with two AckReqs per window the timed
#: PSN of a paced window waited up to half of it for that ACK, and SRTT read 25-27 ms on a
#: 20 ms path at 1 % loss (SimNet), lengthening the recovery period and the pace's period.
#: With four (and the timer's floor, ``congestion.K_RTO_SRTTS``), SRTT reads 20 ms and WRITE
#: at 10 ms each way and 1 % loss moves 0.78 MB/s instead of 0.45 at 12.5 MB/s, 0.51 instead
#: of 0.38 at 2.5 MB/s; at 1 Gbit/s and 1 % loss 80 MB/s instead of 67 (medians of 3 seeds).
ACKS_PER_WINDOW = 4


class Requester:
    """Send-side state of one QP; transmit, rewind and the retry counters."""

    __slots__ = (
        "acked_mark", "cc", "cc_on", "comp_opcode", "comp_psn", "credits", "delivery", "draining", "fast",
        "max_rd_atomic", "mtu", "need_retry", "next_idx", "noack", "pace_deadline", "pacer", "probe_deadline",
        "probe_due", "probed", "progress_at", "qp", "rate", "rd_out", "req_off", "req_psn", "retry_cnt",
        "retry_left", "rexmit_deadline", "rnr_deadline", "rnr_left", "rnr_retry", "rto_backoff", "rtt",
        "rtt_psn", "rtt_sent", "sent_hwm", "sq", "started_retry", "timeout", "window",
    )  # fmt: skip

    def __init__(self, qp: QpContext, window: int, fast: bool = True, congestion: bool = True) -> None:
        self.qp = qp
        self.window = window
        #: Runs of MIDDLE packets take the tight loop (``QpCaps.fast_paths``).
        self.fast = fast
        #: The congestion window and the DCQCN rate apply (``QpCaps.congestion_control``).
        self.cc_on = congestion
        self.sq: deque[SendWqe] = deque()
        #: End-to-end credits (IBTA §9.7.7.2, :mod:`.credits`).
        self.credits = RequesterCredits()
        self.reset()

    def reset(self) -> None:
        """Forget all work and progress (modify to RESET)."""
        self.sq.clear()
        self.credits.reset()
        self.next_idx = 0
        self.req_psn = 0
        self.req_off = 0
        self.noack = 0
        self.sent_hwm = 0
        self.comp_psn = 0
        self.comp_opcode: Opcode | None = None
        self.rd_out = 0
        self.mtu = 1024
        self.max_rd_atomic = 0
        self.timeout: float | None = None
        self.retry_cnt = self.retry_left = 0
        self.rnr_retry = self.rnr_left = 0
        self.started_retry = False
        self.need_retry = False
        self.draining = False
        self.rexmit_deadline: float | None = None
        self.rnr_deadline: float | None = None
        #: While the DCQCN rate holds the next packet back: when it may leave.
        self.pace_deadline: float | None = None
        #: The tail-loss probe (:mod:`.probe`): when it is due, that it is, and that this episode
        #: of progress has had its one.
        self.probe_deadline: float | None = None
        self.probe_due = self.probed = False
        self.cc = Window(self.window)
        self.rtt = RttEstimator()
        self.delivery = DeliveryRate()
        self.rate = Dcqcn()
        self.pacer = Pacer()
        #: ``comp_psn`` as the window last counted it (PSNs past it are newly acknowledged).
        self.acked_mark = 0
        #: The PSN being timed for a round-trip sample and when it first left (Karn's rule).
        self.rtt_psn: int | None = None
        self.rtt_sent = 0.0
        #: Timeouts since the last progress (RFC 6298 §5.5 doubles the timer for each), and
        #: when the last progress was (a retry counts against ``retry_cnt`` only once a local
        #: ACK timeout has passed since).
        self.rto_backoff = 0
        self.progress_at = 0.0

    def set_psn(self, psn: int) -> None:
        """The send queue's first PSN (``sq_psn``)."""
        self.req_psn = self.comp_psn = self.sent_hwm = self.acked_mark = psn
        self.rtt_psn = None

    def set_timeout(self, timeout: int) -> None:
        self.timeout = transport_timeout(timeout)

    def reset_retry_counters(self) -> None:
        """A good response arrived (rxe ``reset_retry_counters()``)."""
        self.retry_left = self.retry_cnt
        self.rnr_left = self.rnr_retry
        self.started_retry = False

    def deadline(self) -> float | None:
        r, t = self.rnr_deadline, self.rexmit_deadline
        if r is None:
            best = t
        else:
            best = r if t is None or r < t else t
        p = self.pace_deadline
        if p is not None and (best is None or p < best):
            best = p
        p = self.probe_deadline
        if p is not None and (best is None or p < best):
            return p
        return best

    def rexmit_timeout(self) -> float | None:
        """The retransmit timer (:mod:`.congestion`, "The retransmit timer"), None when disabled."""
        t = self.timeout
        if t is None or not self.cc_on:
            return t
        rto = self.rtt.rto()
        if rto is None:
            return t
        if rto > t:  # a path slower than the local ACK timeout: wait for it
            return min(rto * (1 << min(self.rto_backoff, 16)), K_MAX_RTO)
        early = max(rto, K_MIN_RTO) * (1 << min(self.rto_backoff, 16))
        return early if early < t else t

    def restart_timer(self, now: float) -> None:
        """Progress was made: count what was acknowledged, time the oldest unacknowledged PSN
        afresh, or stop the timer."""
        comp = self.comp_psn
        acked = (comp - self.acked_mark) & _MASK
        if acked and acked < _HALF:
            self.acked_mark = comp
            self.rto_backoff = 0
            self.progress_at = now
            self.probed = False
            if self.cc_on:
                self.cc.on_ack(acked, now)
                self.delivery.on_ack(acked, now, self.rtt.smoothed)
            timed = self.rtt_psn
            if timed is not None and 0 < (comp - timed) & _MASK < _HALF:
                self.rtt.sample(now - self.rtt_sent)
                self.rtt_psn = None
        if self.timeout is not None and self.req_psn != comp and self.rnr_deadline is None:
            self.arm_timer(now)
        else:
            self.rexmit_deadline = self.probe_deadline = None

    def arm_timer(self, now: float) -> None:
        """Start the retransmit timer and, with congestion control, the tail-loss probe's
        (:mod:`.probe`; one per episode of progress)."""
        timer = self.rexmit_timeout() or self.timeout
        assert timer is not None
        self.rexmit_deadline = now + timer
        pto = probe_timeout(self.rtt, timer) if self.cc_on and not self.probed else None
        self.probe_deadline = None if pto is None else now + pto

    # -- retries (rxe rxe_comp.c COMPST_ERROR_RETRY / COMPST_RNR_RETRY) --

    def error_retry(self, now: float, timeout: bool, counted: bool = True, sequence: bool = False) -> None:
        """Start a go-back-N retry after a timeout, NAK-sequence error (``sequence``) or implied NAK.

        All three count against ``retry_cnt`` (7 never runs out). Without a
        timeout, a retry already under way is not started again until a good
        response resets the counters (rxe ``started_retry``).
        """
        sq = self.sq
        if not sq or sq[0].state == POSTED:
            return
        if self.started_retry and not timeout:
            return
        if self.retry_left > 0 or not counted:
            if self.retry_left != INFINITE_RETRY and counted:
                self.retry_left -= 1
            if self.req_psn != self.comp_psn:
                self.need_retry = True
                self.started_retry = True
                self.qp.stats.retries += 1
                waited = 0.0 if self.rtt_psn is None else now - self.rtt_sent
                self.rtt_psn = None  # Karn: no sample across a retransmission
                if self.cc_on:
                    floor = self.delivery.bdp(self.rtt.minimum)
                    rtt = self.rtt.smoothed or 0.0
                    if timeout:
                        self.cc.on_timeout(now, rtt, floor)
                    else:
                        # Only a NAK-sequence error (a gap in what this requester paced and
                        # timed) may be random: READ responses leave in bursts it does not time.
                        random = sequence and random_loss(self.cc, self.rtt, self.rate, now, waited)
                        if self.cc.on_loss(now, rtt, floor, random, self.comp_psn) and random:
                            self.qp.stats.random_losses += 1
                    # A NAK-sequence error, an implied NAK or a gap in READ responses: a queue
                    # overflowed with what this QP sent or asked for. A timeout alone does not
                    # arm the pacer (``Pacer``).
                    self.pacer.on_cut(now, not timeout)
        else:
            self.qp.fail_send(WcStatus.RETRY_EXC_ERR)

    def rnr_nak(self, now: float, code: int) -> None:
        """Wait the RNR timer, then go back to ``comp_psn`` (IBTA §9.7.5.2.8)."""
        if self.rnr_left > 0:
            if self.rnr_left != INFINITE_RETRY:
                self.rnr_left -= 1
            self.rnr_deadline = now + rnr_delay(code)
            self.rexmit_deadline = self.probe_deadline = None
            self.probe_due = False
            self.rtt_psn = None
            self.need_retry = True
        else:
            self.qp.fail_send(WcStatus.RNR_RETRY_EXC_ERR)

    def on_timer(self, now: float) -> None:
        p = self.pace_deadline
        if p is not None and now >= p:
            self.pace_deadline = None
        r = self.rnr_deadline
        if r is not None and now >= r:
            self.rnr_deadline = None
        q = self.probe_deadline
        if q is not None and now >= q:
            self.probe_deadline = None
            self.probe_due = self.probed = True
        t = self.rexmit_deadline
        if t is not None and now >= t:
            self.rexmit_deadline = None
            self.qp.stats.timeouts += 1
            # Early (the measured round trip's timer, shorter than the local ACK timeout): a
            # retry that does not use up retry_cnt. A whole local ACK timeout without progress
            # counts, as rxe counts every timeout.
            timeout = self.timeout
            since = now - self.progress_at  # negative: a caller's clock went back; count it
            counted = timeout is None or since >= timeout * _NEARLY or since < 0
            if counted:
                self.progress_at = now
            self.rto_backoff += 1
            self.error_retry(now, True, counted)

    def rewind(self) -> None:
        """Go back to ``comp_psn`` (rxe ``req_retry()``)."""
        self.need_retry = False
        sq = self.sq
        self.next_idx = 0
        self.req_psn = comp = self.comp_psn
        self.req_off = 0
        self.noack = 0
        if not sq:
            return
        head = sq[0]
        if head.started and head.kind == SEND_WRITE:
            # Resume at the first unacknowledged packet; never past the last one.
            done = (comp - head.first_psn) & _MASK
            last = max(head.length - 1, 0) // self.mtu
            self.req_off = min(done, last) * self.mtu
        for wqe in sq:
            if wqe.state == POSTED:
                break
            wqe.state = POSTED

    # -- transmit (rxe rxe_requester()) --

    def transmit(self, out: list[Packet | Train], budget: int, now: float, trains: bool = False) -> int:
        """Append up to ``budget`` request packets to ``out``; return how many.

        With ``trains``, a run of MIDDLE packets of one message may be appended
        as one :class:`~rdmakit.wire.Train` (the same packets, see
        ``Train.packets``); the count still counts packets.
        """
        if self.rnr_deadline is not None:
            return 0
        if self.probe_due and budget > 0:
            self.probe_due = False
            probes = tail_probe(self, self.qp.dest_qpn)[:budget]
            if probes:
                out += probes
                self.qp.stats.probes += len(probes)
                return len(probes)
        if self.pace_deadline is not None:
            return 0
        idle = self.req_psn == self.comp_psn and not self.need_retry
        mtu = self.mtu
        window = self.window
        # AckReq at least every ``per_ack + 2`` packets: rxe's 66, or a quarter of a cut
        # congestion window (``ACKS_PER_WINDOW``).
        per_ack = MAX_PKT_PER_ACK
        rate = self.rate
        fit = units = 0  # no READ limit beyond the spec's (``read_fits``)
        if self.cc_on:
            cwnd = self.cc.packets()
            if cwnd < window:
                window = cwnd
                if cwnd < ACKS_PER_WINDOW * (MAX_PKT_PER_ACK + 2):
                    per_ack = max(cwnd // ACKS_PER_WINDOW, 1) - 2
            pacer = self.pacer
            pacer.update(self.cc, self.rtt.smoothed, mtu + PACKET_OVERHEAD, now)
            # A quantum waits for no more than the window has room for (all of it after a
            # rewind); a full window waits for ACKs, not for the pacer.
            room = window if self.need_retry else window - ((self.req_psn - self.comp_psn) & _MASK)
            if room > 0 and (self.next_idx < len(self.sq) or self.need_retry):
                budget, deadline = paced(rate, pacer, now, mtu + PACKET_OVERHEAD, min(budget, room))
                if not budget:
                    self.pace_deadline = deadline
                    return 0
                if pacer.rate is not None:
                    units = budget
            if window < self.window:
                fit = window
        if self.need_retry:
            self.rewind()
        sq = self.sq
        nsq = len(sq)
        dqpn = self.qp.dest_qpn
        psn = self.req_psn
        comp = self.comp_psn
        hwm = self.sent_hwm
        retrans = 0
        n = 0
        idx = self.next_idx
        #: A READ draws its response PSNs from the window and the pace (``read_fits``).
        drawn = 0
        while n < budget and idx < nsq:
            wqe = sq[idx]
            off = self.req_off
            seg0 = wqe.seg0
            if off and seg0 is not None and wqe.kind == SEND_WRITE and self.fast and not wqe.status:
                # A run of MIDDLE packets of the message under way (rxe
                # next_opcode_rc()): only the PSN, AckReq and payload change.
                # Same packets as the generic loop below (tests/engine prove it).
                end = wqe.length - mtu
                if off < end and trains:
                    d = (psn - comp) & _MASK
                    if d < window:
                        m = min(budget - n, window - d, (end - off + mtu - 1) // mtu)
                        if m > 0:
                            ops = wqe.ops
                            assert ops is not None
                            noack = self.noack
                            every = per_ack + 2
                            first = max(per_ack + 1 - noack, 0)
                            if first < m:
                                noack = m - 1 - (first + (m - 1 - first) // every * every)
                            else:
                                noack += m
                                first = -1
                            out.append(
                                Train(ops[0], dqpn, psn, m, seg0[off : off + m * mtu], mtu, first, every)
                            )
                            behind = (hwm - psn) & _MASK
                            if behind < _HALF:
                                retrans += min(m, behind)
                            n += m
                            psn = (psn + m) & _MASK
                            if (psn - hwm) & _MASK < _HALF:
                                hwm = psn
                            off += m * mtu
                            wqe.state = PROCESSING
                            self.noack = noack
                            self.req_off = off
                if off < end:
                    ops = wqe.ops
                    assert ops is not None
                    op = ops[0]
                    noack = self.noack
                    start = n
                    blocked = False
                    while off < end:
                        if n >= budget:
                            blocked = True
                            break
                        d = (psn - comp) & _MASK
                        if window <= d < _HALF:
                            blocked = True
                            break
                        ackreq = noack > per_ack
                        noack = 0 if ackreq else noack + 1
                        out.append(_new_packet(Packet, (
                            op, dqpn, psn, ackreq, False, False, 0xFFFF, False, False,
                            None, None, None, None, None, None, seg0[off : off + mtu],
                        )))  # fmt: skip
                        n += 1
                        if (psn - hwm) & _MASK >= _HALF:
                            retrans += 1
                        psn = (psn + 1) & _MASK
                        if (psn - hwm) & _MASK < _HALF:
                            hwm = psn
                        off += mtu
                    if n > start:
                        wqe.state = PROCESSING
                        self.noack = noack
                        self.req_off = off
                    if blocked:
                        break
            if wqe.status:
                break  # a local error: completes when it reaches the head
            d = (psn - comp) & _MASK
            if window <= d < _HALF:
                break
            kind = wqe.kind
            if kind == READ and not read_fits(self, wqe, d, fit, n + drawn, units):
                break
            if not wqe.started:
                if self.draining:
                    break
                if kind != SEND_WRITE and not wqe.has_rd:
                    if self.rd_out >= self.max_rd_atomic:
                        break
                    wqe.has_rd = True
                    self.rd_out += 1
                if not self.credits.may_start(wqe.takes_receive, psn == comp):
                    break
                wqe.started = True
            wr = wqe.wr
            if kind == SEND_WRITE:
                off = self.req_off
                length = wqe.length
                rest = length - off
                first = off == 0
                if first:
                    wqe.first_psn = psn
                    wqe.last_psn = (psn + (max(length - 1, 0) // mtu)) & _MASK
                if rest <= mtu:
                    last = True
                    size = rest
                    ackreq = True
                else:
                    last = False
                    size = mtu
                    ackreq = self.noack > per_ack
                    self.noack += 1
                ops = wqe.ops
                assert ops is not None
                op = ops[(first << 1) | last]
                if size == 0:
                    payload: memoryview | bytes = b""
                elif seg0 is not None:
                    payload = seg0[off : off + size]
                else:
                    payload = gather(wqe.segs, off, size)
                reth = RETH(wr.remote_addr, wr.rkey, length) if first and wqe.is_write else None
                imm = wqe.imm if last else None
                pkt = Packet(
                    op, dqpn, psn, ackreq, last and wqe.solicited, False, 0xFFFF, False, False, reth,
                    None, None, None, imm, None, payload,
                )  # fmt: skip
                if last:
                    wqe.state = PENDING
                    idx += 1
                    self.req_off = 0
                else:
                    wqe.state = PROCESSING
                    self.req_off = off + size
                step = 1
            elif kind == READ:
                done = wqe.read_done
                rest = wqe.length - done
                step = max(rest - 1, 0) // mtu + 1
                drawn += step - 1
                wqe.first_psn = psn
                wqe.last_psn = (psn + step - 1) & _MASK
                pkt = Packet(
                    Opcode.RDMA_READ_REQUEST, dqpn, psn, True, False, False, 0xFFFF, False, False,
                    RETH(wr.remote_addr + done, wr.rkey, rest),
                )  # fmt: skip
                wqe.state = PENDING
                idx += 1
                ackreq = True
            else:
                if wr.opcode == WrOpcode.ATOMIC_CMP_AND_SWP:
                    op = Opcode.COMPARE_SWAP
                    aeth = AtomicETH(wr.remote_addr, wr.rkey, wr.swap, wr.compare_add)
                else:
                    op = Opcode.FETCH_ADD
                    aeth = AtomicETH(wr.remote_addr, wr.rkey, wr.compare_add, 0)
                wqe.first_psn = wqe.last_psn = psn
                pkt = Packet(
                    op, dqpn, psn, True, False, False, 0xFFFF, False, False, None, None, aeth
                )  # fmt: skip
                wqe.state = PENDING
                idx += 1
                step = 1
                ackreq = True
            if ackreq:
                self.noack = 0
            out.append(pkt)
            n += 1
            if (psn - hwm) & _MASK >= _HALF:
                retrans += 1
            psn = (psn + step) & _MASK
            if (psn - hwm) & _MASK < _HALF:
                hwm = psn
        if n:
            if self.rtt_psn is None:
                # Time the first PSN of this call, even a resent one: after a NAK-sequence error
                # the responder answers nothing past it before the resent copy arrives, and after
                # a timeout the first copy had a whole timeout to be answered (Karn's ambiguity
                # is only the sample that was under way, dropped at the retry).
                self.rtt_psn, self.rtt_sent = self.req_psn, now
            self.next_idx = idx
            self.req_psn = psn
            if hwm != self.sent_hwm:
                self.sent_hwm = hwm
            if retrans:
                self.qp.stats.retransmits += retrans
            if self.rexmit_deadline is None and self.timeout is not None:
                if idle:
                    self.progress_at = now
                self.arm_timer(now)
            if self.cc_on:
                rate.sent(n * (mtu + PACKET_OVERHEAD), now)
                self.pacer.sent((n + drawn) * (mtu + PACKET_OVERHEAD))
        return n


def read_fits(req: Requester, wqe: SendWqe, d: int, fit: int, drawn: int, units: int) -> bool:
    """May the READ ``wqe`` be requested now, ``d`` PSNs past ``comp_psn``?

    The spec's window counts a READ at its first PSN only (rxe does too), so a window of
    512 PSNs lets eight 64 KB READs out at once and their responders' 512 packets meet
    at the bottleneck together. Once the congestion window is cut (``fit``: its size, 0
    while it is the spec's, so a clean path sends what rxe sends), every response PSN a
    READ will draw counts, as a WRITE's packets do, though one READ may always go when
    nothing else is outstanding; and while the pacer holds a rate (``units``: the
    packets its bucket lets go now, 0 when not paced), a READ spends the pace of its
    responses, in debt if need be, so that requests leave as their responses can
    arrive, not in a burst the responder turns into a burst of responses.
    """
    if fit or units:
        step = max(wqe.length - wqe.read_done - 1, 0) // req.mtu + 1
        if fit and d and d + step > fit:
            return False
        if units and drawn >= units:
            return False
    return True
