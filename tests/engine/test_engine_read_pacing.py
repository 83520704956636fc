"""READs through a shallow queue: the requester's window and pacer govern READ requests by
the response PSNs they draw, and the responder paces its responses once some were lost.

Streams are 64 KiB READs as ``ib_read_bw`` sends them between two hosts (16 outstanding,
128 posted, MTU 1024, a 512-PSN window) on the seeded SimNet, in virtual time.
"""

import math

import pytest

from rdmakit.engine import QpCaps, WrOpcode
from rdmakit.engine.congestion import PACKET_OVERHEAD, RESPONSE_PACING_GAIN, ResponsePacer
from rdmakit.testing import simgoodput
from rdmakit.testing.engine import Pair, make_pair, send_wr
from rdmakit.testing.faults import BOTTLENECK_DEEP, BOTTLENECK_SHALLOW
from rdmakit.testing.simgoodput import MSG, stream

SEED = 28
PKT = 1024 + PACKET_OVERHEAD


def test_shallow_queue_reads_keep_the_link_busy() -> None:
    """Unpaced, each 64 KiB READ's 64 responses meet a 64 KB queue at once and lose their
    tail, found only by the retransmit timer; paced, the link stays busy."""
    on = stream(BOTTLENECK_SHALLOW, WrOpcode.RDMA_READ, True, count=128)
    off = stream(BOTTLENECK_SHALLOW, WrOpcode.RDMA_READ, False, count=128)
    print(f"READ shallow: {on.mbs:.1f} MB/s on ({on.timeouts} timeouts), {off.mbs:.1f} off")
    assert on.ok
    assert off.ok
    assert on.of_link > 0.7
    assert on.timeouts <= 1
    assert on.mbs > 5 * off.mbs


def test_a_clean_path_reads_exactly_as_rxe_does() -> None:
    """Nothing lost: neither the READ window nor either pacer changes a packet."""
    on = stream(BOTTLENECK_DEEP, WrOpcode.RDMA_READ, True, count=48)
    off = stream(BOTTLENECK_DEEP, WrOpcode.RDMA_READ, False, count=48)
    assert on.ok
    assert off.ok
    assert on.retransmits == off.retransmits == 0
    assert on.digest == off.digest
    assert on.of_link > 0.9


def _posted_reads(cc: bool, count: int = 8) -> tuple[Pair, int]:
    p = make_pair(SEED, caps=QpCaps(max_unacked_psns=512, congestion_control=cc), mem_size=8 * MSG, mtu=1024)
    a, b = p.a, p.b
    for i in range(count):
        off = i * MSG
        a.qp.post_send(
            send_wr(i, WrOpcode.RDMA_READ, (a.sge(off, MSG),), remote_addr=b.mr.addr + off, rkey=b.mr.rkey)
        )
    return p, count


@pytest.mark.parametrize("cut", [False, True])
def test_a_cut_window_counts_the_response_psns_of_a_read(cut: bool) -> None:
    """The spec's window counts a READ at its first PSN: 512 PSNs let eight 64-PSN READs out
    at once (rxe's rule, kept while the window is whole). A window cut to 200 lets three,
    not the four whose first PSNs fit."""
    p, _ = _posted_reads(True)
    req = p.a.qp.req
    if cut:
        req.cc.on_timeout(0.0, 0.001)  # down to the minimum, then what slow start allows
        req.cc.cwnd = 200.0
    sent = p.a.qp.poll_transmit(0.0)
    assert [x.opcode.name for x in sent] == ["RDMA_READ_REQUEST"] * (3 if cut else 8)


def test_a_cut_window_still_lets_one_read_out() -> None:
    """A READ longer than the whole window goes when nothing else is outstanding."""
    p, _ = _posted_reads(True, count=2)
    req = p.a.qp.req
    req.cc.on_timeout(0.0, 0.001)  # 2 packets
    assert len(p.a.qp.poll_transmit(0.0)) == 1


def test_paced_read_requests_spend_the_pace_of_their_responses() -> None:
    """With the pacer running, a 64 KiB READ costs the bucket 64 packets, not one: the
    next request waits until its responses' time has passed at the pace."""
    p, _ = _posted_reads(True)
    qp = p.a.qp
    req = qp.req
    req.rtt.sample(0.001)
    req.pacer.on_cut(0.0, True)  # armed, the bucket empty
    assert qp.poll_transmit(0.0) == []  # the pace starts with an empty bucket
    now = 1.0  # long enough for a full bucket
    qp.handle_timer(now)
    first = qp.poll_transmit(now)
    assert len(first) == 1
    rate = req.pacer.rate
    assert rate is not None
    assert qp.poll_transmit(now) == []
    deadline = qp.get_timer()
    assert deadline is not None
    # The bucket is in debt by the rest of 64 packets: the next waits for most of them.
    assert deadline - now >= (64 - req.pacer.burst / PKT) * PKT / rate * 0.99


def test_the_responder_paces_only_after_a_duplicate_read() -> None:
    """A READ answered whole, then asked again (its responses were lost): from then on the
    responder's output leaves at its pace, and its QP's timer shows when the next may."""
    p = make_pair(SEED, caps=QpCaps(max_unacked_psns=512, congestion_control=True), mem_size=MSG, mtu=1024)
    a, b = p.a.qp, p.b.qp
    for i in range(4):
        a.post_send(
            send_wr(i, WrOpcode.RDMA_READ, (p.a.sge(0, MSG),), remote_addr=p.b.mr.addr, rkey=p.b.mr.rkey)
        )
    requests = a.poll_transmit(0.0)
    assert len(requests) == 4
    pacer = b.resp.pacer
    assert pacer is not None
    t = 0.0
    for request in requests:  # four READs of 64 responses, 0.6 ms apart: a measured rate
        b.receive(request, t)
        assert len(b.poll_transmit(t)) == 64
        assert not pacer.armed
        t += 0.0006
    assert pacer.best > 0
    b.receive(requests[-1], t)  # a duplicate: the requester went back for lost responses
    assert pacer.armed
    assert b.poll_transmit(t) == []  # the pace starts with an empty bucket
    assert pacer.rate == pytest.approx(RESPONSE_PACING_GAIN * pacer.best)
    deadline = b.get_timer()
    assert deadline is not None
    assert deadline > t
    assert not b.may_transmit()
    b.handle_timer(deadline)
    quantum = b.poll_transmit(deadline)
    assert 0 < len(quantum) < 64  # a quantum at the pace, not the whole READ at once
    assert b.get_timer() is None  # the next quantum is timed when it is asked for


def test_without_congestion_control_the_responder_has_no_pacer() -> None:
    p = make_pair(SEED, caps=QpCaps(congestion_control=False))
    assert p.b.qp.resp.pacer is None


def test_the_response_pacer_measures_spells_of_sending() -> None:
    """A spell lasts while responses are queued or the next leave within a sample period;
    a silence with nothing to send is not counted against the rate."""
    r = ResponsePacer()
    for i in range(11):  # 100 KB every 0.1 ms, 1 GB/s, with responses still queued
        r.measure(100_000, i * 1e-4, True)
    assert r.best == pytest.approx(1e9, rel=0.11)
    r.measure(1000, 2e-3, False)  # the queue emptied
    best = r.best
    r.measure(1000, 1.0, False)  # a second later: a new spell, no sample over the silence
    r.measure(1000, 1.0 + 1e-4, False)
    assert r.best == best
    r.pace(PKT, 1.0)
    assert r.rate is None  # not armed
    r.armed = True
    r.pace(PKT, 1.0)
    assert r.rate == pytest.approx(RESPONSE_PACING_GAIN * best)
    assert math.isfinite(r.burst)


def test_the_one_packet_path_steps_aside_for_a_read_past_the_cut_window() -> None:
    """``tx_small`` sends a READ request as one packet, whatever the READ's length: with a
    cut window it must hold back the READ whose responses do not fit, as ``poll_transmit``
    does."""
    p = make_pair(SEED, caps=QpCaps(max_unacked_psns=512, congestion_control=True), mem_size=MSG, mtu=1024)
    a, b = p.a, p.b
    req = a.qp.req
    req.cc.on_timeout(0.0, 0.001)  # 2 packets
    a.qp.post_send(send_wr(1, WrOpcode.RDMA_WRITE, (a.sge(0, 8),), remote_addr=b.mr.addr, rkey=b.mr.rkey))
    assert a.qp.tx_small(0.0) is not None  # one PSN outstanding
    a.qp.post_send(send_wr(2, WrOpcode.RDMA_READ, (a.sge(0, 4096),), remote_addr=b.mr.addr, rkey=b.mr.rkey))
    assert a.qp.tx_small(0.0) is None  # 1 + 4 response PSNs > 2
    assert a.qp.poll_transmit(0.0) == []


def test_the_simnet_table_refuses_a_bad_count(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        simgoodput.main(["--count", "0"])
    assert e.value.code == 2
    assert "--count is 1..100000" in capsys.readouterr().err
