"""The simulated network: determinism, the real codec on every packet, and each fault."""

import itertools
import random

import pytest

from rdmakit.engine import WcStatus, WrOpcode
from rdmakit.testing.engine import Workload, fill, make_pair, send_wr
from rdmakit.testing.faults import MIXED
from rdmakit.transport.simnet import Faults, SimNet
from rdmakit.wire import ROCE_UDP_PORT, Opcode, Packet, encode, icrc_ipv4, pack_icrc

HOSTILE = MIXED


def traced_run(seed: int, faults: Faults) -> tuple[str, list[tuple[int, WcStatus]], bytes]:
    p = make_pair(seed, faults, mtu=256, mem_size=1 << 15)
    rng = random.Random(seed)
    fill(p.a.mem, rng)
    fill(p.b.mem, rng)
    w = Workload(p.a, p.b, rng, 20, 700, 0, 1 << 14)
    w.post()
    assert p.run_until_completions(w.n_signaled, len(w.expect_recv))
    w.check()
    return p.net.trace_digest(), [(c.wr_id, c.status) for c in p.a.sent], bytes(p.b.mem)


def test_same_seed_same_trace() -> None:
    for seed in range(5):
        first = traced_run(seed, HOSTILE)
        assert traced_run(seed, HOSTILE) == first
    assert traced_run(1, HOSTILE)[0] != traced_run(2, HOSTILE)[0]


def test_trace_records_every_fate() -> None:
    p = make_pair(3, HOSTILE, mtu=256)
    fill(p.a.mem, random.Random(3))
    for i in range(30):
        p.a.qp.post_send(
            send_wr(i, WrOpcode.RDMA_WRITE, (p.a.sge(0, 2000),), remote_addr=p.b.mr.addr, rkey=p.b.mr.rkey)
        )
    assert p.run_until_completions(30)
    assert p.net.run(max_time=1.0)  # until idle: nothing left in flight
    s = p.net.stats
    assert s["lost"]
    assert s["duplicated"]
    assert s["corrupted"]
    assert s["delivered"]
    # The ICRC catches every flip except in BTH byte 4 (FECN, BECN, reserved),
    # which it masks by design (IBTA A17.3.3): 8 bits in a few hundred bytes.
    caught = s["bad_icrc"] + s["undecodable"]
    assert caught <= s["corrupted"] <= caught + 3
    assert s["sent"] + s["duplicated"] == s["lost"] + s["delivered"] + caught + s["no_qp"]
    assert p.b.mem[:2000] == p.a.mem[:2000]
    trace = p.net.trace
    assert trace is not None
    assert len(trace) == sum(s.values())
    assert all(x.time <= y.time for x, y in itertools.pairwise(trace))


def test_loss_rate_is_what_was_asked() -> None:
    net = SimNet(7, Faults(loss=0.25))
    pkt = Packet(Opcode.SEND_ONLY, 5, 1, payload=b"abc")
    for _ in range(4000):
        net.send("x", "y", pkt)
    assert 900 < net.stats["lost"] < 1100


def test_delay_and_rate_shape_virtual_time() -> None:
    p = make_pair(4, Faults(delay=1e-3))
    p.a.qp.post_send(
        send_wr(1, WrOpcode.RDMA_WRITE, (p.a.sge(0, 8),), remote_addr=p.b.mr.addr, rkey=p.b.mr.rkey)
    )
    assert p.run_until_completions(1)
    assert p.net.now == pytest.approx(2e-3)  # request and ACK, 1 ms each way
    q = make_pair(5, Faults(delay=0.0, rate=1e6), mtu=1024)
    q.a.qp.post_send(
        send_wr(1, WrOpcode.RDMA_WRITE, (q.a.sge(0, 10 * 1024),), remote_addr=q.b.mr.addr, rkey=q.b.mr.rkey)
    )
    assert q.run_until_completions(1)
    assert 10e-3 < q.net.now < 12e-3  # ten ~1 KiB packets at 1 MB/s


def test_bad_icrc_undecodable_and_unknown_qp_are_dropped_and_counted() -> None:
    p = make_pair(6)
    net, b = p.net, p.b.qp
    pkt = Packet(Opcode.SEND_ONLY, b.qpn, 0, payload=b"hi")
    body = encode(pkt)
    ip_a, ip_b = net._ip("a"), net._ip("b")
    good = body + pack_icrc(icrc_ipv4(ip_a, ip_b, 0xC000, ROCE_UDP_PORT, body))
    net.send_bytes("a", "b", good[:-1] + bytes([good[-1] ^ 1]))
    junk = b"\xff" * 12
    net.send_bytes("a", "b", junk + pack_icrc(icrc_ipv4(ip_a, ip_b, 0xC000, ROCE_UDP_PORT, junk)))
    other = encode(pkt._replace(dest_qp=b.qpn ^ 1))
    net.send_bytes("a", "b", other + pack_icrc(icrc_ipv4(ip_a, ip_b, 0xC000, ROCE_UDP_PORT, other)))
    net.send_bytes("a", "b", b"\x00")
    net.run(max_time=1.0)
    assert net.stats["bad_icrc"] == 1
    assert net.stats["undecodable"] == 1
    assert net.stats["no_qp"] == 1
    assert net.stats["runt"] == 1
    assert b.stats.packets_in == 0


def test_icrc_covers_the_simulated_ip_addresses() -> None:
    p = make_pair(8)
    net = p.net
    body = encode(Packet(Opcode.SEND_ONLY, p.b.qp.qpn, 0))
    wrong_src = icrc_ipv4(bytes(4), net._ip("b"), 0xC000, ROCE_UDP_PORT, body)
    net.send_bytes("a", "b", body + pack_icrc(wrong_src))
    net.run(max_time=1.0)
    assert net.stats["bad_icrc"] == 1


def test_partition_window_and_run_timeout() -> None:
    p = make_pair(9, timeout=10)
    p.net.partition(start=0.0, end=0.05)
    p.a.qp.post_send(
        send_wr(1, WrOpcode.RDMA_WRITE, (p.a.sge(0, 8),), remote_addr=p.b.mr.addr, rkey=p.b.mr.rkey)
    )
    assert not p.net.run(until=lambda: len(p.a.scq) > 0, max_time=0.01)
    assert p.net.now == pytest.approx(0.01)
    assert p.net.run(until=lambda: len(p.a.scq) > 0, max_time=1.0)
    assert p.a.scq.poll()[0].status is WcStatus.SUCCESS
    assert 0.05 <= p.net.now < 0.06
    assert p.net.stats["partitioned"] >= 1


def test_attach_rejects_a_duplicate_qpn() -> None:
    p = make_pair(10)
    with pytest.raises(ValueError, match="already attached"):
        p.net.attach("a", p.a.qp)
    p.net.detach("a", p.a.qp)
    p.net.attach("a", p.a.qp)


def test_idle_network_returns() -> None:
    net = SimNet(0)
    assert net.run() is True
    assert net.run(until=lambda: False, max_time=1.0) is False
