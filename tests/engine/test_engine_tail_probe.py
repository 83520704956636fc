"""The tail-loss probe (``engine.probe``, RFC 8985 §7 adapted to go-back-N): a loss with
nothing sent after it is asked for again after two round trips of silence, not found by the
retransmit timer, and the probe costs no timeout, no window cut and no ``retry_cnt``.

Packets are carried by hand between two engines (any of them may be dropped); the last
tests run ``ib_read_bw``/``ib_write_bw``-like streams on the seeded SimNet at 1 % loss.
"""

import pytest

from rdmakit.engine import QpCaps, WrOpcode
from rdmakit.engine.congestion import K_MIN_PTO, K_PTO_RTTS
from rdmakit.testing.engine import Pair, make_pair, send_wr
from rdmakit.testing.faults import GIGABIT_LOSS
from rdmakit.testing.simgoodput import stream
from rdmakit.wire import Opcode

SEED = 28
SRTT = 0.002  # a measured round trip: the probe comes K_PTO_RTTS of them after the last word


def _pair(cc: bool = True) -> Pair:
    p = make_pair(SEED, caps=QpCaps(congestion_control=cc), mtu=256, timeout=14)
    p.a.qp.req.rtt.sample(SRTT)
    return p


def _post(p: Pair, op: WrOpcode, length: int = 1024) -> None:
    wr = send_wr(1, op, (p.a.sge(0, length),), remote_addr=p.b.mr.addr, rkey=p.b.mr.rkey)
    p.a.qp.post_send(wr)


def _quiet_until(p: Pair, now: float) -> float:
    """The requester's next deadline, which must come after ``now``; its timer run there."""
    a = p.a.qp
    t = a.get_timer()
    assert t is not None
    assert t > now
    a.handle_timer(t)
    return t


def _settle(p: Pair, now: float) -> None:
    """Carry every packet both ways, running the requester's deadlines, until it is done."""
    a, b = p.a.qp, p.b.qp
    for _ in range(100):
        moved = False
        for x in a.poll_transmit(now):
            b.receive(x, now)
            moved = True
        for r in b.poll_transmit(now):
            a.receive(r, now)
            moved = True
        if not moved:
            t = a.get_timer()
            if t is None:
                return
            now = t
            a.handle_timer(now)
    raise AssertionError("no end")


def test_a_lost_last_read_response_is_asked_for_again_after_two_round_trips() -> None:
    p = _pair()
    a, b = p.a.qp, p.b.qp
    _post(p, WrOpcode.RDMA_READ)
    (request,) = a.poll_transmit(0.0)
    b.receive(request, 0.0)
    responses = b.poll_transmit(0.0)
    assert len(responses) == 4
    for r in responses[:3]:
        a.receive(r, 0.001)  # the last response is lost
    req = a.req
    cwnd, left = req.cc.cwnd, req.retry_left
    srtt = req.rtt.smoothed
    assert srtt is not None
    t = _quiet_until(p, 0.001)
    assert t == pytest.approx(0.001 + max(K_PTO_RTTS * srtt, K_MIN_PTO))
    (probe,) = a.poll_transmit(t)
    assert probe.opcode is Opcode.RDMA_READ_REQUEST
    assert probe.psn == responses[3].psn
    assert probe.reth is not None
    assert (probe.reth.va, probe.reth.dma_len) == (p.b.mr.addr + 768, 256)
    # A probe, not a timeout: no window cut, no retry spent, no go-back-N.
    assert (a.stats.timeouts, a.stats.retries, a.stats.probes) == (0, 0, 1)
    assert (req.cc.cwnd, req.retry_left) == (cwnd, left)
    b.receive(probe, t)
    (again,) = b.poll_transmit(t)
    assert again.opcode is Opcode.RDMA_READ_RESPONSE_LAST  # a replay from its middle (rxe read_reply())
    assert again.psn == probe.psn
    a.receive(again, t + 0.001)
    (done,) = p.a.scq.poll(1)
    assert done.status.name == "SUCCESS"
    assert p.a.mem[:1024] == p.b.mem[:1024]


def test_a_lost_last_write_packet_is_sent_again() -> None:
    """RFC 8985's probe: the last packet again (and the first unacknowledged, here a duplicate)."""
    p = _pair()
    a, b = p.a.qp, p.b.qp
    _post(p, WrOpcode.RDMA_WRITE)
    packets = a.poll_transmit(0.0)
    assert len(packets) == 4
    for x in packets[:3]:
        b.receive(x, 0.0)
    assert b.poll_transmit(0.0) == []  # no AckReq yet: nothing tells the requester
    t = _quiet_until(p, 0.0)
    first, last = a.poll_transmit(t)  # the first unacknowledged PSN, and the last sent
    assert first == packets[0]._replace(ackreq=True)
    assert last == packets[3]  # the same packet (it carries AckReq already)
    b.receive(first, t)  # a duplicate: an ACK of all the responder has
    b.receive(last, t)
    for ack in b.poll_transmit(t):
        a.receive(ack, t + 0.001)
    assert p.a.scq.poll(1)[0].status.name == "SUCCESS"
    assert a.stats.timeouts == 0


def test_a_resent_packet_lost_again_behind_a_nak_is_probed_at_the_first_unacknowledged_psn() -> None:
    """After its NAK-sequence error the responder drops every packet past the gap without a
    word (IBTA §9.7.5.1.2): a lost resend of the first is found only by sending that one. The
    probe sends it and the last packet; the responder takes the first and NAKs the next gap."""
    p = _pair()
    a, b = p.a.qp, p.b.qp
    _post(p, WrOpcode.RDMA_WRITE)
    packets = a.poll_transmit(0.0)
    b.receive(packets[0], 0.0)
    b.receive(packets[2], 0.0)  # packets[1] lost: a NAK-sequence error for it
    b.receive(packets[3], 0.0)  # dropped silently, the NAK already sent
    (nak,) = b.poll_transmit(0.0)
    a.receive(nak, 0.001)
    assert a.poll_transmit(0.001) == []  # the cut armed the pacer: go-back-N leaves at its pace
    paced = _quiet_until(p, 0.001)
    resent = a.poll_transmit(paced)
    assert [x.psn for x in resent] == [x.psn for x in packets[1:]]
    for x in resent[1:]:  # resent[0] lost again
        b.receive(x, paced)
    assert b.poll_transmit(paced) == []
    t = _quiet_until(p, paced)
    probes = a.poll_transmit(t)
    assert [x.psn for x in probes] == [packets[1].psn, packets[3].psn]
    assert probes[0].ackreq
    assert a.stats.timeouts == 0
    for x in probes:
        b.receive(x, t)
    replies = b.poll_transmit(t)
    assert [r.psn for r in replies] == [packets[1].psn, packets[2].psn]  # ACK, then NAK the next gap
    for r in replies:
        a.receive(r, t + 0.001)
    _settle(p, t + 0.001)  # go-back-N from the new gap, at its pace
    assert p.a.scq.poll(1)[0].status.name == "SUCCESS"
    assert a.stats.timeouts == 0
    assert p.b.mem[:1024] == p.a.mem[:1024]


def test_one_probe_per_episode_then_the_timer() -> None:
    """A probe that draws no progress is not repeated, even when a stale response re-arms the
    timers: the retransmit timer fires next, as before."""
    p = _pair()
    a, b = p.a.qp, p.b.qp
    _post(p, WrOpcode.RDMA_WRITE, 256)
    (one,) = a.poll_transmit(0.0)
    b.receive(one, 0.0)
    (ack,) = b.poll_transmit(0.0)
    a.receive(ack, 0.001)
    _post(p, WrOpcode.RDMA_WRITE)
    a.poll_transmit(0.001)  # all lost
    t = _quiet_until(p, 0.001)
    assert len(a.poll_transmit(t)) == 2  # lost too
    a.receive(ack, t)  # a stale duplicate: no progress
    assert a.stats.timeouts == 0
    _quiet_until(p, t)
    assert (a.stats.timeouts, a.stats.probes) == (1, 2)


def test_without_congestion_control_there_is_no_probe() -> None:
    p = _pair(cc=False)
    a = p.a.qp
    _post(p, WrOpcode.RDMA_WRITE)
    a.poll_transmit(0.0)
    _quiet_until(p, 0.0)
    assert (a.stats.timeouts, a.stats.probes) == (1, 0)


@pytest.mark.parametrize("op", [WrOpcode.RDMA_READ, WrOpcode.RDMA_WRITE])
def test_random_loss_is_recovered_without_timeouts(op: WrOpcode) -> None:
    """256 × 64 KiB at 1 % loss on a 1 Gbit/s link: every tail loss is probed. Before the probe
    a READ window cut to one READ waited out the timer for each lost last response (14
    timeouts, 0.36 of the link) and WRITE for each lost AckReq (5)."""
    r = stream(GIGABIT_LOSS, op, True)
    print(f"{op.name} at 1 % loss: {r.of_link:.2f} of the link, {r.timeouts} timeouts")
    assert r.ok
    assert r.timeouts == 0
    assert r.of_link > 0.5
