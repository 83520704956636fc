"""Attacks on the TCP transport: whoever can connect to a ``tcp:`` device's listener.

Each attack is followed by a legitimate WRITE, READ and SEND between the two
real devices, checked byte for byte: the attack must not have broken them.
Virtual time (``now`` handed to ``progress``) stands in for waiting.
"""

import os
import resource
import socket
import time
from collections.abc import Callable, Iterator
from functools import partial

import pytest

from rdmakit.engine import SGE, Access, CompletionQueue, SendWR, WcStatus, WrOpcode
from rdmakit.transport import tcp_limits
from rdmakit.transport.connect import connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver
from rdmakit.wire import FRAME_HEADER, MAX_FRAME, max_frame_body
from tests.security.hostile_tcp import (
    A_PSN,
    MEM,
    Pair,
    close_all,
    dial,
    fake_endpoint,
    is_closed,
    preface,
    rss,
    write_frame,
)


@pytest.fixture
def pair(new_ip: Callable[[], str]) -> Iterator[Pair]:
    p = Pair(new_ip)
    yield p
    p.close()


def _wait(pred: Callable[[], bool], pump: Callable[[], object], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while not pred() and time.monotonic() < end:
        pump()
        time.sleep(0.001)
    return pred()


@pytest.mark.parametrize("who", ["spoofed-address", "wrong-secret", "wrong-peer"])
def test_a_stranger_cannot_inject_a_write(pair: Pair, new_ip: Callable[[], str], who: str) -> None:
    """A stream that claims to be device a cannot write b's memory, with a's next PSN and
    b's R_Key in hand; the real connection carries on.

    spoofed-address: from another address, claiming a's, with the right secret (read
    from b's descriptor). wrong-secret: from a's own address, with a guessed secret.
    wrong-peer: from its own address, claimed truthfully, with the right secret, while
    b's QP is connected to a.
    """
    a, b = pair.a, pair.b
    stranger = new_ip()
    src, claim, secret, counter = {
        "spoofed-address": (stranger, a.ip, pair.b_secret, "tcp_spoofed"),
        "wrong-secret": (a.ip, a.ip, os.urandom(tcp_limits.SECRET_LEN), "tcp_bad_secret"),
        "wrong-peer": (stranger, stranger, pair.b_secret, "tcp_wrong_peer"),
    }[who]
    evil = b"\xee" * 4096
    s = dial(src, (b.ip, b.port))
    try:
        s.setblocking(True)
        s.sendall(preface(claim, a.port, pair.qb.qpn, secret))
        s.sendall(write_frame(pair.qb.qpn, A_PSN, pair.mrb.addr, pair.mrb.rkey, evil))
        assert _wait(lambda: is_closed(s), pair.pump), "the listener kept the stream"
    finally:
        s.close()
    assert getattr(b.counters, counter) == 1
    assert pair.bmem[: len(evil)] == bytes(len(evil))  # nothing landed
    assert pair.qb.stats.packets_in == 0
    pair.transfer(1)


def test_huge_frame_headers_allocate_nothing(pair: Pair) -> None:
    """Even with the secret and a's address, a frame header claiming more than the MTU
    (here the 64 MiB the framing allows at most) closes the stream before any allocation."""
    a, b = pair.a, pair.b
    assert b.tcp is not None
    before = rss()
    for claimed in (MAX_FRAME, max_frame_body(1 << 20) + 1):
        s = dial(a.ip, (b.ip, b.port))
        try:
            s.setblocking(True)
            s.sendall(preface(a.ip, a.port, pair.qb.qpn, pair.b_secret))
            s.sendall(FRAME_HEADER.pack(claimed) + b"\0" * 64)
            assert _wait(partial(is_closed, s), pair.pump), "the listener kept the stream"
        finally:
            s.close()
        assert b.tcp.buffered() <= tcp_limits.READ_BUFFER
    assert b.counters.tcp_bad_length == 2
    assert rss() - before < 32 << 20
    pair.transfer(2)


def test_idle_and_slowloris_connections_are_closed_after_the_preface_timeout(
    pair: Pair, new_ip: Callable[[], str]
) -> None:
    b = pair.b
    assert b.tcp is not None
    socks = [dial(new_ip(), (b.ip, b.port)) for _ in range(20)]
    try:
        t0 = time.monotonic()
        assert _wait(lambda: b.tcp is not None and b.tcp.pending == 20, lambda: b.progress(t0))
        for i, s in enumerate(socks[10:]):  # slowloris: most of a preface, a byte at a time
            for byte in preface(b.ip, 1, 2, bytes(tcp_limits.SECRET_LEN))[: 10 + i]:
                s.send(bytes([byte]))
                b.progress(t0)
        assert not any(is_closed(s) for s in socks)
        b.progress(t0 + tcp_limits.PREFACE_TIMEOUT / 2)
        assert b.tcp.pending == 20
        b.progress(t0 + tcp_limits.PREFACE_TIMEOUT + 0.1)
        assert b.tcp.pending == 0
        assert b.counters.tcp_preface_timeout == 20
        assert _wait(lambda: all(is_closed(s) for s in socks), lambda: None)
        assert b.deadline_hint() is None or b.deadline_hint() != t0 + tcp_limits.PREFACE_TIMEOUT
    finally:
        close_all(socks)
    pair.transfer(3)


def test_connections_waiting_for_a_preface_are_limited(pair: Pair, new_ip: Callable[[], str]) -> None:
    b = pair.b
    assert b.tcp is not None
    n = 3 * tcp_limits.MAX_PENDING
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(dial(new_ip(), (b.ip, b.port)))
            b.progress(time.monotonic())
        assert _wait(lambda: sum(map(is_closed, socks)) == n - tcp_limits.MAX_PENDING, pair.pump)
        assert not any(is_closed(s) for s in socks[-tcp_limits.MAX_PENDING :])  # the oldest went first
        assert b.tcp.pending == tcp_limits.MAX_PENDING
        assert b.counters.tcp_pending_dropped == n - tcp_limits.MAX_PENDING
        pair.transfer(4)  # a's stream still gets in
    finally:
        close_all(socks)


def test_a_peer_that_never_reads_leaves_the_send_queue_bounded(new_ip: Callable[[], str]) -> None:
    """The peer is a listener that never reads: a's queue stops at its bound, and once it
    stands still a's WRITEs end in RETRY_EXC_ERR, as on a link that lost everything."""
    now = [time.monotonic()]
    a = SoftDevice(new_ip(), transport="tcp", port=0)
    sink = socket.socket()
    sink.bind((new_ip(), 0))
    sink.listen(1)  # the kernel completes the handshake; nobody ever reads
    drv = Driver(lambda: now[0])
    drv.add(a)
    try:
        assert a.tcp is not None
        cq = CompletionQueue(256)
        qp = a.create_qp(send_cq=cq, recv_cq=cq)
        local_endpoint(a, qp, A_PSN)
        peer = fake_endpoint(*sink.getsockname())
        connect_qp(a, qp, A_PSN, peer)
        src = bytearray(MEM)
        mr = a.pd.register(src, 0x10_0000, Access.NONE)
        for i in range(64):
            qp.post_send(
                SendWR(
                    wr_id=i, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(mr.addr, MEM, mr.lkey),),
                    remote_addr=0x1000, rkey=1,
                )
            )  # fmt: skip
        route = tcp_limits.Route(peer.ip, peer.port, peer.qpn, bytes.fromhex(peer.secret))
        bound = tcp_limits.MAX_QUEUED + max_frame_body(1 << 20)
        most = 0
        done: list[WcStatus] = []
        for _ in range(2000):
            drv.progress()
            most = max(most, a.tcp.queued(route))
            done += [wc.status for wc in cq.poll(64)]
            if len(done) == 64:
                break
            now[0] += 0.05
        assert most <= bound
        assert most > tcp_limits.MAX_QUEUED // 2  # the queue did fill: the bound was what held it
        assert done[0] is WcStatus.RETRY_EXC_ERR
        assert set(done[1:]) == {WcStatus.WR_FLUSH_ERR}
        assert a.counters.tcp_held > 0
    finally:
        drv.close()
        a.close()
        sink.close()


def test_a_thousand_hostile_connections_cost_the_listener_little_memory(
    pair: Pair, new_ip: Callable[[], str]
) -> None:
    """Idle, slowloris and huge-header connections, 1,000 in all: the listener's resident
    memory grows by at most 64 MiB, and the real pair still moves data."""
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * n + 256
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below the {need} descriptors needed")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    b = pair.b
    assert b.tcp is not None
    pair.transfer(5)  # buffers of the real streams are in before the baseline
    before = rss()
    socks: list[socket.socket] = []
    huge = preface(pair.a.ip, pair.a.port, pair.qb.qpn, bytes(tcp_limits.SECRET_LEN)) + FRAME_HEADER.pack(
        MAX_FRAME
    )
    try:
        for i in range(n):
            s = dial(new_ip(), (b.ip, b.port))
            socks.append(s)
            b.progress(time.monotonic())
            kind = i % 3
            try:
                if kind == 1:
                    s.send(huge[: 1 + i % 40])  # slowloris: part of a preface
                elif kind == 2:
                    s.send(huge + b"\0" * 4096)  # a whole (bad) preface, then a huge header
            except OSError:
                pass  # not connected yet, or already dropped
            if i % 50 == 49:
                pair.pump(5)
                assert rss() - before <= 64 << 20, f"after {i + 1} connections"
        pair.pump(20)
        assert rss() - before <= 64 << 20
        assert b.tcp.pending <= tcp_limits.MAX_PENDING
        assert (
            b.tcp.buffered() <= 2 * tcp_limits.READ_BUFFER + tcp_limits.MAX_PENDING * tcp_limits.PREFACE_LEN
        )
    finally:
        close_all(socks)
    pair.transfer(6)
