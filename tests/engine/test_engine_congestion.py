"""Loss and congestion on the seeded SimNet: the congestion window, the measured round trip and DCQCN.

Each run moves the same RDMA WRITEs with the congestion control on and off
(``QpCaps.congestion_control``; off, the requester behaves as rxe's) over one
profile of `rdmakit.testing.faults`, in virtual time; the seed replays it
exactly.
"""

from dataclasses import dataclass, replace

import pytest

from rdmakit.engine import QpCaps, WrOpcode
from rdmakit.engine.congestion import (
    DCQCN_CNP_INTERVAL,
    DCQCN_MIN_RATE,
    K_RANDOM_BACKLOG,
    K_RANDOM_WINDOW_SHARE,
    K_RTO_SRTTS,
    PACING_CA_GAIN,
    PACING_QUANTUM,
    Dcqcn,
    Pacer,
    RttEstimator,
    Window,
    paced,
    random_loss,
)
from rdmakit.engine.timers import MAX_PKT_PER_ACK
from rdmakit.testing.engine import make_pair, send_wr
from rdmakit.testing.faults import BOTTLENECK_DEEP, BOTTLENECK_ECN, BOTTLENECK_SHALLOW, GIGABIT, WAN, Faults
from rdmakit.testing.simgoodput import stream
from rdmakit.wire import Train

MSG = 512 * 1024
SEED = 28


@dataclass
class Run:
    count: int
    ok: bool
    seconds: float
    retransmits: int
    lost: int
    timeouts: int
    cnps: int
    digest: str

    @property
    def goodput(self) -> float:
        return self.count * MSG / self.seconds


def run(
    faults: Faults, cc: bool, *, seed: int = SEED, timeout: int = 14, window: int = 1024, count: int = 4
) -> Run:
    """``count`` 512 KB WRITEs from a to b, a 1024-PSN window (ib_write_bw's scale), MTU 1024."""
    caps = QpCaps(max_unacked_psns=window, congestion_control=cc)
    p = make_pair(seed, faults, caps=caps, mem_size=MSG, mtu=1024, timeout=timeout)
    a, b = p.a, p.b
    for i in range(count):
        sge = (a.sge(0, MSG),)
        a.qp.post_send(send_wr(i, WrOpcode.RDMA_WRITE, sge, remote_addr=b.mr.addr, rkey=b.mr.rkey))
    ok = p.run_until_completions(count, max_time=120.0)
    st, net = a.qp.stats, p.net.stats
    lost = net["lost"] + net["queue_full"]
    mbs = count * MSG / p.net.now / 1e6
    print(f"seed {seed} cc={cc}: {mbs:.1f} MB/s, {st.retransmits} resent, {lost} lost, "
          f"{st.timeouts} timeouts, {st.cnps_received} CNPs")  # fmt: skip
    return Run(
        count,
        ok and all(c.status.name == "SUCCESS" for c in a.sent),
        p.net.now,
        st.retransmits,
        lost,
        st.timeouts,
        st.cnps_received,
        p.net.trace_digest(),
    )


def test_a_clean_bottleneck_sees_exactly_what_rxe_sends() -> None:
    """No loss, no mark: the congestion control changes no packet (the window starts at the spec's)."""
    on, off = run(BOTTLENECK_DEEP, True), run(BOTTLENECK_DEEP, False)
    assert on.ok
    assert off.ok
    assert on.retransmits == off.retransmits == 0
    assert on.digest == off.digest
    assert on.goodput > 0.9 * GIGABIT


def test_a_shallow_buffer_no_longer_collapses_goodput() -> None:
    """A 64 KB queue at 1 Gbit/s: go-back-N over a 1024-PSN window overflows it again with every
    resend; the congestion window brings what is in flight down to what the queue holds."""
    on, off = run(BOTTLENECK_SHALLOW, True), run(BOTTLENECK_SHALLOW, False)
    assert on.ok
    assert off.ok
    assert on.goodput > 1.5 * off.goodput
    assert on.retransmits * 20 < off.retransmits
    assert on.lost * 20 < off.lost


def test_after_the_first_overflow_a_paced_window_keeps_a_shallow_queue() -> None:
    """Sixteen 512 KB WRITEs into a 64 KB queue. The first window overflows it (as it does for
    rxe: both start at the spec's window); after the first NAK-sequence error the window is
    paced over the round trip, so what is lost after the first window is a few packets per
    cut, not the half window each AckReq releases at once (which overflowed the queue and
    lost the resent head, found only by the retransmit timer)."""
    on = run(BOTTLENECK_SHALLOW, True, count=16)
    assert on.ok
    assert on.timeouts <= 2  # the first window's tail, and slow start's first overshoot
    assert on.lost <= 1024 + 32
    assert on.goodput > 0.4 * GIGABIT


def test_the_pacer_starts_at_an_overflow_and_paces_in_quanta() -> None:
    w, p, d = Window(1024), Pacer(), Dcqcn()
    pkt = 1100
    p.update(w, 0.001, pkt, 0.0)
    assert p.rate is None  # a clean path: not paced
    w.on_timeout(0.0, 0.001)
    p.on_cut(0.0, False)
    p.update(w, 0.001, pkt, 0.0)
    assert p.rate is None  # a timeout alone (a long path's first round trip) does not start it
    w = Window(1024)
    w.on_loss(1.0, 0.001)
    p.on_cut(1.0, True)
    p.update(w, 0.001, pkt, 1.0)
    rate = p.rate
    assert rate == pytest.approx(PACING_CA_GAIN * w.cwnd * pkt / 0.001)
    assert rate is not None
    n, when = paced(d, p, 1.0, pkt, 1 << 30)
    assert n == 0  # the cut emptied the bucket: nothing leaves in a burst
    assert when == pytest.approx(1.0 + PACING_QUANTUM * pkt / rate, abs=1e-6)
    n, _ = paced(d, p, when, pkt, 1 << 30)
    assert n == PACING_QUANTUM  # a quantum at once, not a packet per wake-up
    n, _ = paced(d, p, when + 1.0, pkt, 1 << 30)
    assert n * pkt <= p.burst  # a long pause saves at most a burst


@pytest.mark.parametrize("loss", [0.001, 0.01, 0.05])
def test_resends_per_loss_are_bounded(loss: float) -> None:
    """Random loss at a 1 Gbit/s link: each loss resends about what the path holds (its
    bandwidth-delay product, the window's floor), not up to the whole 1024-PSN window."""
    faults = Faults(rate=GIGABIT, loss=loss, delay=50e-6)
    on, off = run(faults, True), run(faults, False)
    assert on.ok
    assert off.ok
    assert on.retransmits <= off.retransmits
    assert on.retransmits <= 1024 + 64 * on.lost  # the first window, then about the path per loss


def test_ecn_marks_bring_cnps_that_lower_the_rate() -> None:
    """A queue marking CE (DCQCN's switch settings): the responder sends CNPs, the requester's
    DCQCN rate keeps the queue short of overflowing, and fewer packets are lost than without."""
    on, off = run(BOTTLENECK_ECN, True), run(BOTTLENECK_ECN, False)
    assert on.ok
    assert off.ok
    assert on.cnps > 0
    assert on.lost * 5 < off.lost
    assert on.goodput > off.goodput


def test_a_seed_replays_a_congested_run() -> None:
    assert run(BOTTLENECK_SHALLOW, True).digest == run(BOTTLENECK_SHALLOW, True).digest
    assert run(BOTTLENECK_SHALLOW, True).digest != run(BOTTLENECK_SHALLOW, True, seed=SEED + 1).digest


@pytest.mark.parametrize("timeout", [14, 16])
def test_a_100_ms_round_trip_causes_no_spurious_retries(timeout: int) -> None:
    """A WAN path (100 ms round trip, jitter). The device default (timeout 16, 268 ms) holds from
    the start; a local ACK timeout shorter than the round trip (14, 67 ms) can expire before the
    first round trip is measured, but never after: the timer follows the measured path."""
    r = run(WAN, True, timeout=timeout)
    assert r.ok
    assert r.timeouts <= (1 if timeout == 14 else 0)
    assert r.retransmits <= (1024 if timeout == 14 else 0)


def test_the_window_halves_once_per_round_trip_and_grows_back() -> None:
    w = Window(128)
    assert w.packets() == 128
    assert w.on_loss(1.0, rtt=0.01)
    assert w.packets() == 64
    assert not w.on_loss(1.005, rtt=0.01)  # the same window's losses
    assert w.packets() == 64
    w.on_ack(64, 1.02)  # congestion avoidance: one packet per window acknowledged
    assert w.packets() == 65
    w.on_timeout(2.0, rtt=0.01)
    assert w.packets() == 2
    w.on_ack(10, 2.001)  # slow start, even in the timeout's recovery period
    assert w.packets() == 12
    w2 = Window(128)
    w2.on_loss(0.0, rtt=0.01, floor=100.0)  # never below the path's bandwidth-delay product
    assert w2.packets() == 100


def test_dcqcn_cuts_by_alpha_and_recovers() -> None:
    """Zhu et al. 2015, Figure 7: the first CNP halves the measured rate (alpha starts at 1);
    fast recovery then halves the distance to the target at each timer event, and pacing ends
    back at the rate it was cut from."""
    d = Dcqcn()
    assert d.allowance(0.0) == float("inf")
    for i in range(100):
        d.sent(100_000, i * 1e-4)  # 1 GB/s for 10 ms
    d.on_cnp(0.01)
    assert d.rate is not None
    assert d.rate == pytest.approx(d.target / 2, rel=0.01)
    assert d.target == pytest.approx(1e9, rel=0.05)
    cut = d.rate
    d.on_cnp(0.01 + DCQCN_CNP_INTERVAL)  # alpha is now just under 1: another near-halving
    assert d.rate < cut * 0.51
    d.advance(0.01 + 5 * 55e-6)
    assert d.rate is not None
    assert d.rate > cut * 0.5
    d.advance(1.0)
    assert d.rate is None  # recovered
    low = Dcqcn()
    low.on_cnp(0.0)  # nothing measured: the floor
    assert low.rate == DCQCN_MIN_RATE


def test_cnps_are_one_per_interval() -> None:
    p = make_pair(SEED, BOTTLENECK_DEEP)
    b = p.b.qp
    b.congestion_experienced(1.0)
    b.congestion_experienced(1.0 + DCQCN_CNP_INTERVAL / 2)
    assert b.poll_cnp()
    assert not b.poll_cnp()
    b.congestion_experienced(1.0 + DCQCN_CNP_INTERVAL)
    assert b.poll_cnp()
    assert (b.stats.ce_received, b.stats.cnps_sent) == (3, 2)


def test_a_cnp_without_congestion_control_changes_nothing() -> None:
    """A QP without congestion control that receives CNPs (as kernel rxe does, which drops them):
    they are counted, nothing is paced, and every WRITE completes."""
    faults = replace(BOTTLENECK_ECN, ecn_kmin=0, ecn_pmax=1.0)
    r = run(faults, False)
    assert r.ok
    assert r.cnps > 0


def _reads(cc: bool) -> tuple[float, int]:
    """32 RDMA READs of 64 KB, 16 outstanding, over the shallow bottleneck: (seconds, packets lost)."""
    size = 64 * 1024
    caps = QpCaps(max_unacked_psns=1024, congestion_control=cc)
    p = make_pair(
        SEED, BOTTLENECK_SHALLOW, caps=caps, mem_size=16 * size, mtu=1024, max_rd_atomic=16, timeout=14
    )
    a, b = p.a, p.b
    for i in range(32):
        off = i % 16 * size
        a.qp.post_send(
            send_wr(i, WrOpcode.RDMA_READ, (a.sge(off, size),), remote_addr=b.mr.addr + off, rkey=b.mr.rkey)
        )
    assert p.run_until_completions(32, max_time=60.0)
    assert all(c.status.name == "SUCCESS" for c in a.sent)
    assert a.mem == b.mem
    return p.net.now, p.net.stats["queue_full"]


def test_a_gap_in_read_responses_is_a_loss_at_once() -> None:
    """A READ response past the one expected means those between were lost: the requester goes
    back at once (as for a NAK-sequence error) instead of waiting out its timer, as rxe does."""
    (t_on, lost_on), (t_off, lost_off) = _reads(True), _reads(False)
    print(f"READs: {t_on:.3f} s, {lost_on} lost with congestion control; {t_off:.3f} s, {lost_off} without")
    assert t_on < t_off
    assert lost_on * 5 < lost_off


@pytest.mark.parametrize("cc", [True, False])
def test_a_read_response_after_a_gap_goes_back_at_once(cc: bool) -> None:
    """The second of four READ responses is lost: the third tells the requester at once (with
    congestion control; rxe waits for its timer), and the retried READ asks from the gap on."""
    p = make_pair(SEED, caps=QpCaps(congestion_control=cc), mtu=256)
    a, b = p.a.qp, p.b.qp
    a.post_send(
        send_wr(1, WrOpcode.RDMA_READ, (p.a.sge(0, 1024),), remote_addr=p.b.mr.addr, rkey=p.b.mr.rkey)
    )
    (req,) = a.poll_transmit(0.0)
    b.receive(req, 0.0)
    responses = b.poll_transmit(0.0)
    assert len(responses) == 4
    a.receive(responses[0], 0.0)
    a.receive(responses[2], 0.0)
    assert a.stats.retries == (1 if cc else 0)
    again = a.poll_transmit(0.0)
    if cc:
        assert len(again) == 1
        assert again[0].psn == responses[1].psn
        assert again[0].reth is not None
        assert again[0].reth.va == p.b.mr.addr + 256
    else:
        assert again == []


def test_a_cut_window_asks_for_an_ack_every_quarter_of_it() -> None:
    """Below rxe's spacing, AckReq comes four times per congestion window (``ACKS_PER_WINDOW``): the
    oldest PSN of a paced window waits a quarter of it for its ACK, not half (SRTT stays the
    path's). An uncut window keeps rxe's 64."""
    for cwnd, most in ((40, 40 // 4), (1024, MAX_PKT_PER_ACK + 2)):
        p = make_pair(SEED, caps=QpCaps(max_unacked_psns=1024), mtu=256, timeout=14, mem_size=MSG)
        req = p.a.qp.req
        req.cc.cwnd = float(cwnd)
        length = min(cwnd, 200) * 256
        wr = send_wr(1, WrOpcode.RDMA_WRITE, (p.a.sge(0, length),), remote_addr=p.b.mr.addr, rkey=p.b.mr.rkey)
        p.a.qp.post_send(wr)
        sent = [y for x in p.a.qp.poll_transmit(0.0) for y in (x.packets() if isinstance(x, Train) else [x])]
        assert len(sent) == length // 256
        asks = [i for i, x in enumerate(sent) if x.ackreq]
        gaps = [j - i for i, j in zip([-1, *asks], asks, strict=False)]
        assert asks[-1] == len(sent) - 1  # the LAST
        assert max(gaps) <= most
        assert max(gaps) > most - 2  # and not much more often


def test_the_timer_waits_more_than_a_steady_round_trip() -> None:
    """RTTVAR falls to nearly nothing on a steady path; the timer stays ``K_RTO_SRTTS`` round
    trips, the time a paced go-back-N resend takes to be answered."""
    est = RttEstimator()
    for _ in range(200):
        est.sample(0.02)
    assert est.rto() == pytest.approx(K_RTO_SRTTS * 0.02)
    jittery = RttEstimator()
    for i in range(200):
        jittery.sample(0.02 if i % 2 else 0.04)
    rto = jittery.rto()
    assert rto is not None
    assert jittery.smoothed is not None
    assert rto > K_RTO_SRTTS * jittery.smoothed  # a variable path: RFC 6298's own term


def test_random_loss_on_a_long_path_keeps_the_window_clocked() -> None:
    """10 ms each way and 1 % loss (the lab's netem path) at 12.5 MB/s, seeds 28-32: with ACKs
    twice per window and the plain RFC 6298 timer, WRITE moved 0.45-0.49 MB/s of virtual time
    and drew up to 3 timeouts (the window from 2 each time). With every loss halving the
    window (bounded below by the delivery rate's BDP), 0.71-0.87, median 0.85, and at most 2
    timeouts; with losses at no queue told apart (``random_loss``), 0.87-1.07, median 1.03: the
    larger window sends more before a resent packet is lost again, and a run drew up to 3."""
    faults = Faults(rate=12.5e6, loss=0.01, delay=10e-3)
    runs = [stream(faults, WrOpcode.RDMA_WRITE, True, count=48, seed=seed) for seed in range(28, 33)]
    for r in runs:
        print(f"{r.mbs:.2f} MB/s, {r.timeouts} timeouts, {r.random_losses} random losses")
        assert r.ok
        assert r.mbs > 0.8
        assert r.timeouts <= 3
        assert r.random_losses > 0
    assert sorted(r.mbs for r in runs)[2] > 0.95


def test_a_loss_at_no_queue_keeps_the_window_to_the_loss_interval() -> None:
    """A random loss does not halve: the window comes down only to ``K_RANDOM_WINDOW_SHARE`` of
    the mean PSNs acknowledged between losses (never by more than half), and slow start climbs
    back to it; a queue's loss still halves (RFC 9002 §7.3.2)."""
    w = Window(512)
    assert w.on_loss(1.0, 0.02, random=True, psn=1000)
    assert w.cwnd == 256  # no interval measured yet: at most by half, as a queue's loss
    w.cwnd = 60.0
    assert w.on_loss(1.05, 0.02, random=True, psn=1100)
    assert w.cwnd == w.ssthresh == 100 * K_RANDOM_WINDOW_SHARE
    w.cwnd = 30.0  # e.g. after a timeout
    assert w.on_loss(1.2, 0.02, random=True, psn=1300)
    cap = (100 + (200 - 100) / 4) * K_RANDOM_WINDOW_SHARE  # the mean moves a quarter of the way
    assert w.cwnd == 30.0  # not cut
    assert w.ssthresh == cap  # slow start climbs to the cap
    w.on_ack(10, 1.3)
    assert w.cwnd == 40.0
    assert w.on_loss(1.4, 0.02, psn=1340)
    assert w.cwnd == 20.0  # a queue's loss halves


def test_a_loss_is_random_only_without_a_queue_or_a_cnp() -> None:
    """Veno's test: fewer than ``K_RANDOM_BACKLOG`` packets queued by the round trip now (the
    latest sample, the smoothed one or the wait of the one under way) and no CNP within it."""
    w, rtt, dcqcn = Window(512), RttEstimator(), Dcqcn()
    assert not random_loss(w, rtt, dcqcn, 1.0, 0.0)  # no sample yet
    for _ in range(20):
        rtt.sample(0.020)
    w.cwnd = 50.0
    assert random_loss(w, rtt, dcqcn, 1.0, 0.0)
    queued = 0.020 / (1 - (K_RANDOM_BACKLOG + 1) / w.cwnd)  # a round trip that queues one more
    assert not random_loss(w, rtt, dcqcn, 1.0, queued)  # the sample under way waited that long
    rtt.sample(queued)
    assert not random_loss(w, rtt, dcqcn, 1.0, 0.0)  # the latest sample
    for _ in range(40):
        rtt.sample(0.020)
    assert random_loss(w, rtt, dcqcn, 1.0, 0.0)
    dcqcn.on_cnp(0.99)
    assert not random_loss(w, rtt, dcqcn, 1.0, 0.0)  # a CNP within the round trip
    assert random_loss(w, rtt, dcqcn, 1.1, 0.0)


@pytest.mark.parametrize(
    "faults",
    [BOTTLENECK_SHALLOW, BOTTLENECK_ECN, Faults(rate=12.5e6, queue_limit=64 * 1024, delay=10e-3)],
    ids=["shallow", "ecn", "wan-shallow"],
)
def test_a_bottleneck_queue_s_losses_are_never_judged_random(faults: Faults) -> None:
    """At a 1 Gbit/s bottleneck with a 64 KB queue, one that marks CE, and a 12.5 MB/s one
    20 ms away with a 64 KB queue, every loss halves the window as before."""
    r = stream(faults, WrOpcode.RDMA_WRITE, True, count=96)
    print(f"{r.mbs:.2f} MB/s, {r.retransmits} resent, {r.dropped} dropped, {r.random_losses} random")
    assert r.ok
    assert r.random_losses == 0
