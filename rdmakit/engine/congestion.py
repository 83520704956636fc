"""The requester's congestion control: a window, a round-trip estimate and a DCQCN rate.

IBTA Vol. 1 leaves congestion to the fabric: an RC requester may keep up to
its window of PSNs unacknowledged (rxe ``RXE_MAX_UNACKED_PSNS``) and, on a
NAK-sequence error or a timeout, goes back to the first unacknowledged PSN
(go-back-N, §9.7.5.1). On a lossy or shallow path that resends up to a whole
window on every loss, and the resent window overflows the same queue again.
Three pieces of state, each driven only by ``now`` and the requester's
events, keep a QP alive where a TCP connection stays alive:

- ``Window``: a congestion window in packets beside the spec's window, as
  NewReno keeps one (RFC 5681, RFC 6582; constant names from RFC 9002 §7 and
  its Appendix B). It starts at the spec's window (a clean path sees rxe's
  behaviour exactly); slow start and congestion avoidance grow it per PSN
  acknowledged; a NAK-sequence error or implied NAK halves it once per
  window of data (a recovery period ends when the PSN sent last before the
  cut is acknowledged); a timeout shrinks it to the minimum. Go-back-N then
  resends at most the window, and the bound of Mittal et al. ("Revisiting
  Network Support for RDMA", SIGCOMM 2018: a go-back-N window near the
  bandwidth-delay product keeps its efficiency near 1 / (1 + p·W)) holds.
- ``RttEstimator``: RFC 6298's smoothed round trip and variance, from the
  time of a PSN's first transmission to its acknowledgement (Karn's rule: a
  sample is never taken across a retransmission).
- ``Dcqcn``: the reaction point of DCQCN (Zhu et al., "Congestion Control
  for Large-Scale RDMA Deployments", SIGCOMM 2015, §3.1): a CNP (RoCEv2
  Annex A17.9) cuts the current rate by alpha/2; alpha decays every K
  without a CNP; the rate recovers in fast recovery, additive and hyper
  increase stages counted by a timer and a byte counter. Before the first
  CNP the QP is not paced, as DCQCN starts at line rate.

- ``Pacer``: once a queue overflowed with SEND or WRITE data or READ responses
  (a NAK-sequence error or a gap cut the window), the window's packets, and the
  response packets READ requests ask for, are spread over the round
  trip rather than sent as ACKs release them: Linux TCP's pacing rate
  (``tcp_update_pacing_rate()``: 200 % of cwnd/SRTT in slow start, 120 %
  after), in bursts of at most about a millisecond of it, as its TSO
  autosizing (``tcp_tso_autosize()``) sizes a burst. A window the size of a
  shallow queue otherwise leaves in bursts of half a window (one per
  AckReq), and a 64 KB queue overflows long before the window fills the
  path.

- ``probe_timeout``: when the tail-loss probe (:mod:`.probe`, RFC 8985 §7) asks
  again for what a silence may have lost, before the retransmit timer.

- ``ResponsePacer``: the responder's side of a READ. Its responses are the data,
  and no ACK comes back for them; once the requester went back for lost ones (a
  duplicate READ request), they leave at twice the rate they have been leaving at.

The requester sends while ``psn_diff(req_psn, comp_psn) < min(window,
Window.packets())`` (once the window is cut, a READ counts all its response PSNs)
and, while a rate holds, as ``paced`` allows.
"""

import math

from rdmakit.wire.psn import PSN_MASK

# -- the window (RFC 9002 §7.2 names; units are packets: one PSN is one packet) --

#: RFC 9002 kMinimumWindow (2 datagrams).
K_MINIMUM_WINDOW = 2
#: RFC 9002 kLossReductionFactor: a loss halves the window.
K_LOSS_REDUCTION_FACTOR = 0.5
#: TCP Veno's beta (Fu and Liew, IEEE JSAC 21(2), 2003): a loss while the window keeps fewer
#: packets than this queued on the path (cwnd · (1 - min RTT / RTT)) is random, not an overflow.
K_RANDOM_BACKLOG = 3
#: After a random loss the window is at most this share of the packets delivered between
#: loss events (``Window.interval``): go-back-N resends about a window per loss, so at most
#: a third of what is sent is resent (Mittal et al. 2018: efficiency 1 / (1 + p·W) >= 2/3).
K_RANDOM_WINDOW_SHARE = 0.5
#: The gain of the mean loss interval (as RFC 6298's alpha weighs RTT samples).
K_INTERVAL_GAIN = 1 / 4

# -- the round trip (RFC 6298 §2) --

#: The delivery rate's maximum keeps this much of itself per round trip without a higher sample.
K_RATE_DECAY = 0.9

#: RFC 6298 alpha: the gain of the smoothed round trip.
K_RTT_ALPHA = 1 / 8
#: RFC 6298 beta: the gain of the round-trip variation.
K_RTT_BETA = 1 / 4
#: RFC 6298 K: the retransmission timeout is SRTT + K · RTTVAR.
K_RTO_VARIANCE = 4
#: RFC 9002 kGranularity: the least variation term, seconds.
K_GRANULARITY = 0.001
#: The timer is at least this many smoothed round trips. On a steady path RTTVAR falls to
#: nearly nothing, and SRTT + 4 · RTTVAR is the round trip itself; but the answer to a
#: go-back-N resend comes a round trip after the resent AckReq packet, which the pacer lets
#: leave up to a quarter of the window after the cut (``requester.ACKS_PER_WINDOW``). Without
#: this floor, SimNet's 10 ms each way at 1 % loss drew 5-11 spurious timeouts per 3 MB,
#: each restarting the window from 2 (with it: 1-2, and WRITE 0.65 → 0.78 MB/s at 12.5 MB/s).
K_RTO_SRTTS = 1.5
#: RFC 6298 §2.5: a maximum may be placed on the timer, provided it is at least 60 s.
K_MAX_RTO = 60.0
#: The least early timer (one shorter than the local ACK timeout), seconds. A go-back-N
#: timeout that fires while the answer is only queued resends everything in flight; a burst
#: of a whole window can queue for milliseconds at a bottleneck (RFC 6298 §2.4 sets 1 s for
#: TCP; Linux's TCP_RTO_MIN is 200 ms).
K_MIN_RTO = 0.01

# -- the tail-loss probe (RFC 8985 §7) --

#: RFC 8985 §7.2: the probe timeout is two smoothed round trips of silence.
K_PTO_RTTS = 2
#: The least probe timeout, seconds (RFC 9002 kGranularity): a host's scheduling, not the
#: path, decides silences shorter than this.
K_MIN_PTO = K_GRANULARITY

# -- DCQCN (Zhu et al. 2015, §3 and the parameters of §5) --

#: g: alpha's gain.
DCQCN_G = 1 / 256
#: K: alpha decays once per this many seconds without a CNP (55 µs).
DCQCN_ALPHA_PERIOD = 55e-6
#: T: the rate-increase timer (55 µs).
DCQCN_TIMER = 55e-6
#: B: the rate-increase byte counter (10 MB).
DCQCN_BYTES = 10_000_000
#: F: increase events spent in fast recovery before additive increase.
DCQCN_F = 5
#: R_AI: the additive increase step, bytes per second (40 Mbit/s).
DCQCN_RATE_AI = 40e6 / 8
#: R_HAI: the hyper increase step, bytes per second (10 × R_AI).
DCQCN_RATE_HAI = 10 * DCQCN_RATE_AI
#: The notification point sends at most one CNP per QP in this many seconds (N = 50 µs).
DCQCN_CNP_INTERVAL = 50e-6
#: The least rate a CNP can bring a QP down to, bytes per second (10 Mbit/s).
DCQCN_MIN_RATE = 10e6 / 8
#: Bytes the pacer may send at once after an idle spell (a burst of a few packets).
DCQCN_BURST = 64 * 1024
#: Bytes a packet adds to its payload on the wire, for the pacer: IPv4 20, UDP 8, BTH 12,
#: RETH 16, ICRC 4 (RoCEv2 Annex A17.4) and an Ethernet header and FCS, 18.
PACKET_OVERHEAD = 78
#: Seconds over which the sending rate is measured, to start the first cut from.
RATE_SAMPLE_PERIOD = 1e-3
#: Pacing ends once the rate is back within 1 % of the rate it was first cut from.
_RECOVERED = 0.99
#: Rate-increase events run at once after a long pause at most (the rate has recovered long before).
_MAX_EVENTS = 1 << 16


# -- the window's pacer (Linux net/ipv4/tcp_input.c, tcp_output.c) --

#: sysctl_tcp_pacing_ss_ratio: the pace in slow start, of cwnd / SRTT.
PACING_SS_GAIN = 2.0
#: sysctl_tcp_pacing_ca_ratio: the pace in congestion avoidance.
PACING_CA_GAIN = 1.2
#: A burst is at most this many seconds of the pace (sk_pacing_shift 10: about 1 ms), at
#: least two packets, at most ``DCQCN_BURST``.
PACING_BURST_TIME = 1e-3
#: The pacer lets packets go in quanta of this many at least (where the bucket holds them):
#: one send of a few packets per wake-up keeps the GSO batches a userspace sender needs,
#: as fq's quantum keeps TSO bursts (Linux net/sched/sch_fq.c, ``quantum``).
PACING_QUANTUM = 16
#: The responder's READ responses leave at up to this many times the rate they have been
#: leaving at (``ResponsePacer``): a burst of a READ's responses then fills a queue at
#: half the rate it would unpaced at twice the bottleneck's rate, and a requester that
#: asks for more is held back by less than a sample period.
RESPONSE_PACING_GAIN = 2.0


class Window:
    """A NewReno congestion window in packets (RFC 5681 §3.1, RFC 6582), at most ``limit``."""

    __slots__ = ("cwnd", "interval", "limit", "loss_psn", "recovery_until", "slow_restart", "ssthresh")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # The whole spec window from the start, as DCQCN starts at line rate: no slow start
        # before the first loss, so a clean path sends exactly what rxe sends.
        self.cwnd = float(limit)
        self.ssthresh = math.inf
        #: A recovery period: losses before this time belong to the window already cut. Go-back-N
        #: resends the same PSNs, so the period is one round trip, not "until a packet sent
        #: after the cut is acknowledged" (RFC 9002 §7.3.2).
        self.recovery_until = -math.inf
        #: The period began with a timeout: slow start runs in it (RFC 5681 §3.1).
        self.slow_restart = False
        #: The first unacknowledged PSN at the last loss event (None: none yet), and the mean
        #: of the PSNs acknowledged between loss events (0: none measured).
        self.loss_psn: int | None = None
        self.interval = 0.0

    def set_limit(self, limit: int) -> None:
        """The spec's window changed; before any loss the congestion window follows it."""
        self.limit = limit
        if self.ssthresh == math.inf or self.cwnd > limit:
            self.cwnd = float(limit)

    def packets(self) -> int:
        return max(int(self.cwnd), 1)

    def on_ack(self, acked: int, now: float) -> None:
        """``acked`` PSNs were newly acknowledged (RFC 9002 §7.3.1-§7.3.3)."""
        if now < self.recovery_until and not self.slow_restart:
            return  # no growth while recovering (RFC 9002 OnPacketsAcked)
        if self.cwnd < self.ssthresh:
            self.cwnd += acked
        else:
            self.cwnd += acked / self.cwnd
        if self.cwnd > self.limit:
            self.cwnd = float(self.limit)

    def on_loss(self, now: float, rtt: float, floor: float = 0.0, random: bool = False, psn: int = 0) -> bool:
        """A NAK-sequence error or implied NAK: halve once per round trip (RFC 9002 §7.3.2),
        never below ``floor``, the path's measured bandwidth-delay product
        (``DeliveryRate.bdp``). A ``random`` loss (``random_loss``: no queue, no CNP) has
        nothing to drain: the window only comes down to ``K_RANDOM_WINDOW_SHARE`` of the
        mean loss interval (from ``psn``, the first unacknowledged PSN), and at most by half.
        False if a recovery period covers this loss."""
        if now < self.recovery_until:
            return False
        last, self.loss_psn = self.loss_psn, psn
        if last is not None:
            d = (psn - last) & PSN_MASK
            self.interval = d if not self.interval else self.interval + K_INTERVAL_GAIN * (d - self.interval)
        if random:
            # Never more than a queue's cut; slow start climbs back to the cap (a loss with
            # no queue says nothing of the pipe).
            cap = max(self.interval * K_RANDOM_WINDOW_SHARE, self.cwnd * K_LOSS_REDUCTION_FACTOR)
            self.ssthresh = max(cap, K_MINIMUM_WINDOW)
            self.cwnd = min(self.cwnd, self.ssthresh)
        else:
            self.cwnd = min(max(self.cwnd * K_LOSS_REDUCTION_FACTOR, floor, K_MINIMUM_WINDOW), self.cwnd)
            self.ssthresh = self.cwnd
        self.recovery_until = now + rtt
        self.slow_restart = False
        return True

    def on_timeout(self, now: float, rtt: float, floor: float = 0.0) -> None:
        """The retransmit timer expired: restart from the minimum (RFC 5681 §3.1, eq. 4; RFC 9002
        §7.6.2 persistent congestion); slow start climbs back to half the window, or to
        ``floor`` (the measured bandwidth-delay product) where that is more."""
        self.ssthresh = max(self.cwnd * K_LOSS_REDUCTION_FACTOR, min(floor, self.cwnd), K_MINIMUM_WINDOW)
        self.cwnd = float(K_MINIMUM_WINDOW)
        self.recovery_until = now + rtt
        self.slow_restart = True


class Pacer:
    """A token bucket at the window's pace (``PACING_*``); ``rate`` is None (not paced)
    until a NAK-sequence error, an implied NAK or a gap in READ responses shows a queue
    that overflowed with what the requester sent or asked for, so a clean path sends what
    rxe sends. A timeout alone does not start it (on a long path the local ACK timeout
    can expire before the first round trip is measured). A READ request spends the pace
    of the response packets it asks for (``requester.read_fits``), in debt if need be, so
    READs are asked for as their responses can arrive; the responder spreads each one's
    responses (``ResponsePacer``)."""

    __slots__ = ("armed", "burst", "rate", "tokens", "tokens_at")

    def __init__(self) -> None:
        self.armed = False
        self.rate: float | None = None
        self.burst = 0.0
        self.tokens = 0.0
        self.tokens_at = 0.0

    def update(self, window: Window, srtt: float | None, packet: int, now: float) -> None:
        """Bytes per second from the window and the smoothed round trip."""
        if not self.armed or not srtt:
            self.rate = None
            return
        gain = PACING_SS_GAIN if window.cwnd < window.ssthresh else PACING_CA_GAIN
        rate = gain * window.cwnd * packet / srtt
        if self.rate is None:
            self.tokens_at = now  # the bucket fills from here (``on_cut`` emptied it)
        self.rate = rate
        self.burst = min(max(rate * PACING_BURST_TIME, 2.0 * packet), float(DCQCN_BURST))

    def on_cut(self, now: float, loss: bool) -> None:
        """The window was cut (``loss``: SEND or WRITE data was lost, which arms the pacer):
        what the bucket saved leaves at the pace, not in a burst. The queue that
        overflowed is still full of what go-back-N will discard, and a burst of the resent
        PSNs would be dropped behind it, the head of them with it: the responder sends one
        NAK-sequence per gap (IBTA §9.7.5.1.2), so only the retransmit timer would find that."""
        self.armed |= loss
        self.tokens, self.tokens_at = 0.0, now

    def allowance(self, now: float) -> float:
        rate = self.rate
        if rate is None:
            return math.inf
        t = self.tokens + max(now - self.tokens_at, 0.0) * rate
        self.tokens = min(t, self.burst)
        self.tokens_at = now
        return self.tokens

    def next_send(self, now: float, size: int) -> float:
        rate = self.rate
        if rate is None:
            return now
        # A tenth of a microsecond over: at the deadline itself, floating point could leave the
        # bucket a fraction of a byte short of the quantum, and the wake-up would find nothing.
        return now + max((size - self.tokens) / rate + 1e-7, 1e-6)

    def sent(self, nbytes: int) -> None:
        if self.rate is not None:
            self.tokens -= nbytes


class ResponsePacer(Pacer):
    """The responder's pace for its READ responses, the data a READ's requester only asks
    for: a 64 KB READ is 64 packets the responder would send at once, more than a 64 KB
    queue holds even with nothing else in it. No ACK comes back for a response, so the
    pace is not a window over a round trip: it is ``RESPONSE_PACING_GAIN`` times the
    rate the responses have been leaving at (the highest over ``RATE_SAMPLE_PERIOD``
    spells of sending, decaying, as ``DeliveryRate`` keeps its maximum), which the
    requester's window and pacer set. It runs from the first duplicate READ request
    (responses were lost, the requester went back for them), so a clean path sends what
    rxe sends, and it never holds a response back by more than the gain allows: a
    requester asking for more lifts the measured rate, and with it the pace, each spell."""

    __slots__ = ("best", "idle", "last_at", "sample_at", "sample_bytes")

    def __init__(self) -> None:
        super().__init__()
        self.best = 0.0
        self.sample_at: float | None = None
        self.sample_bytes = 0
        #: The last send emptied the responder's queue, and when it was.
        self.idle = True
        self.last_at = -math.inf

    def pace(self, packet: int, now: float) -> None:
        """The rate from the measured one, once armed."""
        if not self.armed or not self.best:
            self.rate = None
            return
        rate = RESPONSE_PACING_GAIN * self.best
        if self.rate is None:
            self.tokens, self.tokens_at = 0.0, now
        self.rate = rate
        self.burst = min(max(rate * PACING_BURST_TIME, 2.0 * packet), float(DCQCN_BURST))

    def measure(self, nbytes: int, now: float, backlog: bool) -> None:
        """``nbytes`` left now, and responses are still queued (``backlog``) or not. A spell
        of sending lasts while responses are queued (a silence the pacer itself or a busy
        host made is part of it) or the next come within a sample period; a longer one
        with nothing to send ends it, and is not counted."""
        start = self.sample_at
        if start is None or (self.idle and now - self.last_at > RATE_SAMPLE_PERIOD):
            self.sample_at, self.sample_bytes = now, 0
        else:
            span = now - start
            if span >= RATE_SAMPLE_PERIOD:
                self.best = max(self.sample_bytes / span, self.best * K_RATE_DECAY)
                self.sample_at, self.sample_bytes = now, 0
        self.sample_bytes += nbytes
        self.idle, self.last_at = not backlog, now
        self.sent(nbytes)


def paced(dcqcn: "Dcqcn", pacer: Pacer, now: float, packet: int, budget: int) -> tuple[int, float]:
    """Of ``budget`` packets of ``packet`` bytes on the wire, how many the DCQCN rate and the
    window's pace let leave now; with none, when the next may (the pacing deadline)."""
    allowance = min(dcqcn.allowance(now), pacer.allowance(now))
    if allowance >= budget * packet:
        return budget, now
    allowed = int(allowance // packet)
    quantum = min(budget, max(int(pacer.burst // packet), 1), PACING_QUANTUM) if pacer.rate is not None else 1
    if allowed >= quantum:
        return allowed, now
    return 0, max(dcqcn.next_send(now, packet), pacer.next_send(now, quantum * packet))


class DeliveryRate:
    """PSNs acknowledged per second, a decaying maximum over round trips (as BBR's filter,
    Cardwell et al., ACM Queue 14(5), 2016); ``bdp`` is that rate times the least round trip.

    Random loss leaves the delivery rate as it was: the window is not cut below the pipe
    it fills, and go-back-N with a window near the bandwidth-delay product keeps its
    efficiency (Mittal et al. 2018). A queue that overflows bounds the delivery rate at
    the bottleneck's: the window then comes down to what the path holds.
    """

    __slots__ = ("acked", "best", "start")

    def __init__(self) -> None:
        self.start: float | None = None
        self.acked = 0
        self.best = 0.0

    def on_ack(self, acked: int, now: float, rtt: float | None) -> None:
        start = self.start
        if start is None:
            self.start, self.acked = now, 0
            return
        self.acked += acked
        span = now - start
        if rtt is not None and span >= rtt and span > 0:
            rate = self.acked / span
            self.best = max(rate, self.best * K_RATE_DECAY)
            self.start, self.acked = now, 0

    def bdp(self, min_rtt: float) -> float:
        """Packets in flight that keep the path full, 0 while unknown."""
        return self.best * min_rtt if min_rtt < math.inf else 0.0


class RttEstimator:
    """RFC 6298's round-trip estimate; ``rto()`` is None before the first sample."""

    __slots__ = ("latest", "minimum", "smoothed", "variation")

    def __init__(self) -> None:
        self.smoothed: float | None = None
        self.variation = 0.0
        self.latest = 0.0
        self.minimum = math.inf

    def sample(self, rtt: float) -> None:
        if rtt < 0:
            return
        self.latest = rtt
        self.minimum = min(self.minimum, rtt)
        s = self.smoothed
        if s is None:
            self.smoothed = rtt
            self.variation = rtt / 2
        else:
            self.variation = (1 - K_RTT_BETA) * self.variation + K_RTT_BETA * abs(s - rtt)
            self.smoothed = (1 - K_RTT_ALPHA) * s + K_RTT_ALPHA * rtt

    def rto(self) -> float | None:
        """SRTT + max(G, K · RTTVAR) (RFC 6298 §2.3), at least ``K_RTO_SRTTS`` · SRTT, or None
        without a sample."""
        s = self.smoothed
        if s is None:
            return None
        return max(s + max(K_GRANULARITY, K_RTO_VARIANCE * self.variation), K_RTO_SRTTS * s)


def random_loss(window: Window, rtt: RttEstimator, dcqcn: "Dcqcn", now: float, waited: float) -> bool:
    """A loss is random, not a queue's overflow, where the window keeps fewer than
    ``K_RANDOM_BACKLOG`` packets queued by the round trip now (TCP Veno's test; the latest
    sample, the smoothed one or the ``waited`` seconds of the sample under way, whichever
    reads more: a queue that overflows holds back the answers that would show it) and no
    CNP came within that round trip (an ECN mark says a queue is building before a loss does)."""
    s = rtt.smoothed
    if s is None:
        return False
    now_rtt = max(rtt.latest, s, waited)
    if now_rtt <= 0 or now - dcqcn.last_at <= now_rtt:
        return False  # no round trip measured yet, or a CNP within it
    return window.cwnd * (1 - rtt.minimum / now_rtt) < K_RANDOM_BACKLOG


def probe_timeout(rtt: RttEstimator, timer: float) -> float | None:
    """RFC 8985 §7.2's PTO: ``K_PTO_RTTS`` smoothed round trips, at least ``K_MIN_PTO``; None
    before the first sample or where it would not come before the retransmit ``timer``."""
    s = rtt.smoothed
    if s is None:
        return None
    pto = max(K_PTO_RTTS * s, K_MIN_PTO)
    return pto if pto < timer else None


class Dcqcn:
    """DCQCN's reaction point (Zhu et al. 2015, §3.1, Figure 7): the rate a QP may send at.

    ``rate`` is None (line rate, no pacing) until the first CNP. ``allowance(now)``
    says how many bytes may leave now; ``sent(n)`` spends them.
    """

    __slots__ = (
        "alpha", "alpha_at", "byte_events", "bytes_since", "cnps", "last_at", "peak", "rate", "sample_at",
        "sample_bytes", "sample_rate", "target", "timer_at", "timer_events", "tokens", "tokens_at",
    )  # fmt: skip

    def __init__(self) -> None:
        self.rate: float | None = None
        self.target = 0.0
        #: The rate measured when pacing began: the line rate, as far as this QP can tell.
        self.peak = 0.0
        self.alpha = 1.0
        self.alpha_at = 0.0
        self.timer_at = 0.0
        self.timer_events = 0
        self.byte_events = 0
        self.bytes_since = 0
        self.tokens = 0.0
        self.tokens_at = 0.0
        self.cnps = 0
        #: When the last CNP came.
        self.last_at = -math.inf
        #: The sending rate measured over ``RATE_SAMPLE_PERIOD`` (the first cut's start).
        self.sample_at: float | None = None
        self.sample_bytes = 0
        self.sample_rate = 0.0

    def on_cnp(self, now: float) -> None:
        """A CNP arrived: remember the rate as the target, cut it by alpha/2, raise alpha."""
        self.cnps += 1
        self.last_at = now
        rate = self.rate
        if rate is None:
            rate = self.peak = self._measured(now)
            self.tokens, self.tokens_at = float(DCQCN_BURST), now
        else:
            self._decay_alpha(now)
        self.target = rate
        self.rate = max(rate * (1 - self.alpha / 2), DCQCN_MIN_RATE)
        self.alpha = (1 - DCQCN_G) * self.alpha + DCQCN_G
        self.alpha_at = self.timer_at = now
        self.timer_events = self.byte_events = 0
        self.bytes_since = 0

    def _measured(self, now: float) -> float:
        if self.sample_rate:
            return self.sample_rate
        start = self.sample_at
        if start is None:
            return DCQCN_MIN_RATE
        # Less than a whole sample period: what it sent, over at least a period.
        return max(self.sample_bytes / max(now - start, RATE_SAMPLE_PERIOD), DCQCN_MIN_RATE)

    def _decay_alpha(self, now: float) -> None:
        periods = int((now - self.alpha_at) / DCQCN_ALPHA_PERIOD)
        if periods > 0:
            self.alpha *= (1 - DCQCN_G) ** periods
            self.alpha_at += periods * DCQCN_ALPHA_PERIOD

    def _increase(self, timer: bool) -> None:
        """One rate-increase event (Figure 7): fast recovery, then additive, then hyper."""
        if timer:
            self.timer_events += 1
        else:
            self.byte_events += 1
        rate = self.rate
        assert rate is not None
        low, high = min(self.timer_events, self.byte_events), max(self.timer_events, self.byte_events)
        if low > DCQCN_F:
            self.target += (low - DCQCN_F) * DCQCN_RATE_HAI  # hyper increase
        elif high > DCQCN_F:
            self.target += DCQCN_RATE_AI  # additive increase
        # The line rate is unknown here: the rate measured before the first cut stands for it.
        self.target = min(self.target, self.peak)
        self.rate = (self.target + rate) / 2
        if self.rate >= self.peak * _RECOVERED:
            self.rate = None  # back at the rate it was cut from: pacing ends until the next CNP

    def advance(self, now: float) -> None:
        """Run the alpha timer and the rate-increase timer up to ``now``."""
        if self.rate is None:
            return
        self._decay_alpha(now)
        events = int((now - self.timer_at) / DCQCN_TIMER)
        if events > 0:
            self.timer_at += events * DCQCN_TIMER
            for _ in range(min(events, _MAX_EVENTS)):
                self._increase(True)
                if self.rate is None:
                    return

    def allowance(self, now: float) -> float:
        """Bytes that may leave now (``math.inf`` when not paced)."""
        rate = self.rate
        if rate is None:
            return math.inf
        self.advance(now)
        rate = self.rate
        if rate is None:
            return math.inf
        t = self.tokens + max(now - self.tokens_at, 0.0) * rate
        self.tokens = min(t, float(DCQCN_BURST))
        self.tokens_at = now
        return self.tokens

    def next_send(self, now: float, size: int) -> float:
        """When ``size`` bytes will be allowed (the pacer's deadline)."""
        rate = self.rate
        if rate is None:
            return now
        # At least a microsecond on: a deadline equal to ``now`` in floating point would
        # find the same fraction of a packet missing again, forever.
        return now + max((size - self.tokens) / rate, 1e-6)

    def sent(self, nbytes: int, now: float) -> None:
        """``nbytes`` left: spend tokens, count the byte counter, measure the rate."""
        start = self.sample_at
        if start is None:
            self.sample_at, self.sample_bytes = now, nbytes
        else:
            self.sample_bytes += nbytes
            if now - start >= RATE_SAMPLE_PERIOD:
                self.sample_rate = self.sample_bytes / (now - start)
                self.sample_at, self.sample_bytes = now, 0
        if self.rate is None:
            return
        self.tokens -= nbytes
        self.bytes_since += nbytes
        while self.bytes_since >= DCQCN_BYTES and self.rate is not None:
            self.bytes_since -= DCQCN_BYTES
            self._increase(False)
