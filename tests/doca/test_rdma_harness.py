"""Tests of the two-sided RDMA harness (tests/doca/rdma_harness.py): it can pass, fail and clean up."""

import time
from collections.abc import Callable

import pytest

from rdmakit.doca import DocaError, Mmap, RdmaRecvJob, RdmaSendJob
from tests.doca import rdma_harness
from tests.doca.rdma_harness import Pair, PairFactory


def test_pair_connects_and_exchanges_one_message(make_pair: PairFactory) -> None:
    """RDMA guide §4: start, export, connect on both sides; then one send meets one receive."""
    p = make_pair().up()
    mb, mem_b = p.b.mmap(16)
    ma, _ = p.a.mmap(b"ping")
    recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 16))
    send = RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 4))
    ev_recv, ev_send = p.run(recv, send)
    assert ev_recv.ok
    assert ev_send.ok
    assert bytes(mem_b[:4]) == b"ping"


def test_collect_fails_loudly_when_nothing_comes(
    new_ip: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness itself can fail: a receive nobody sends to never completes, and the run says so."""
    monkeypatch.setattr(rdma_harness, "STALL_LIMIT", 0.2)
    p = Pair("udp", "event", new_ip)
    try:
        p.up()
        recv = RdmaRecvJob(ctx=p.b.rdma)
        with pytest.raises(pytest.fail.Exception, match="RdmaRecvJob"):
            p.run(recv)
    finally:
        p.close()


def test_pair_closes_everything(new_ip: Callable[[], str]) -> None:
    """After close, the devices are closed and the contexts too (no socket leaks into later tests)."""
    p = Pair("tcp", "poll", new_ip).up()
    p.close()
    assert all(s.dev.closed and s.rdma.closed for s in p.sides)
    with pytest.raises(DocaError):
        p.a.rdma.export()


def test_progress_of_one_context_collects_for_every_context_on_its_pump(new_ip: Callable[[], str]) -> None:
    """Soft contexts share the process's pump: progressing any one of them delivers the events of
    all, contexts created, connected or closed since its last progress included."""
    first = Pair("udp", "poll", new_ip).up()
    later: Pair | None = None
    try:
        mb, mem_b = first.b.mmap(16)
        ma, _ = first.a.mmap(b"ping")

        def exchange(p: Pair, mb: Mmap, ma: Mmap) -> tuple[RdmaRecvJob, RdmaSendJob]:
            recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 16))
            return recv, RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 4))

        assert all(ev.ok for ev in first.run(*exchange(first, mb, ma)))
        later = Pair("udp", "poll", new_ip).up()  # after `first` has progressed
        recv, send = exchange(later, later.b.mmap(16)[0], later.a.mmap(b"pong")[0])
        later.submit(recv)
        later.submit(send)
        deadline = time.monotonic() + 10.0
        # Only `first.a` progresses; the events it collects for `later` wait in later's WorkQs.
        while not (later.a.wq._ready and later.b.wq._ready):
            assert first.a.wq.progress_retrieve() is None  # `first` itself has nothing in flight
            if time.monotonic() > deadline:
                pytest.fail("the other pair's events never arrived through this context's progress")
        got_recv, got_send = later.b.wq.progress_retrieve(), later.a.wq.progress_retrieve()
        assert got_recv is not None
        assert got_send is not None
        assert (got_recv.job, got_recv.ok, got_send.job, got_send.ok) == (recv, True, send, True)
        later.close()
        later = None
        assert first.a.wq.progress_retrieve() is None  # a closed context is no longer collected
        assert all(ev.ok for ev in first.run(*exchange(first, mb, ma)))
        assert bytes(mem_b[:4]) == b"ping"
    finally:
        if later is not None:
            later.close()
        first.close()
