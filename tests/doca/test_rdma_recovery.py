"""Failed jobs, the ERROR state and the recovery flow (RDMA guide §4-5, ``DOCA_RDMA_STATE_ERROR``).

A job that fails moves the connection to ERROR (IBTA Vol. 1 §10.3.1: the QP
enters the Error state and flushes its work requests); its event is IO_FAILED with a
`DocaError` naming the cause. Every later job fails (flushed) until both sides
run the recovery flow: workq_rm, stop, start, export, connect.
"""

import json
from collections.abc import Callable

import pytest

from rdmakit.doca import (
    AccessFlag,
    DocaError,
    DocaErrorCode,
    Fault,
    Mmap,
    RdmaRecvJob,
    RdmaSendJob,
    RdmaState,
    RdmaWriteJob,
)
from tests.doca.rdma_harness import Pair, PairFactory

RW = AccessFlag.LOCAL_READ_WRITE
WRITABLE = RW | AccessFlag.RDMA_WRITE


def _tampered(export: bytes, dev_pair: Pair) -> Mmap:
    """The peer's mmap export with a wrong rkey: a stale or forged key."""
    desc = json.loads(export)
    desc["rkey"] ^= 0x5A5A
    return Mmap.create_from_export(json.dumps(desc).encode(), dev_pair.a.dev)


def test_error_recovery_flow(make_pair: PairFactory) -> None:
    """A bad rkey fails the write; both sides go to ERROR; later jobs fail; recovery works again."""
    p = make_pair().up()
    mb, mem_b = p.b.mmap(32, WRITABLE)
    export = mb.export_rdma(p.b.dev)
    bad_remote = _tampered(export, p)
    good_remote = p.a.import_mmap(export)
    ma, _ = p.a.mmap(b"first try second try")

    # 1. The failing job names its cause.
    (ev,) = p.run(RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 9), dst_buf=p.a.room(bad_remote, 0, 32)))
    assert ev.status is DocaErrorCode.IO_FAILED
    assert ev.error is not None
    assert (ev.error.code, ev.error.fault) == (DocaErrorCode.NOT_PERMITTED, Fault.PEER)
    assert "refused access" in ev.error.message
    assert "REM_ACCESS_ERR" in ev.error.message
    assert p.a.rdma.rdma_state is RdmaState.ERROR
    assert p.b.rdma.rdma_state is RdmaState.ERROR
    assert p.a.rdma.error is ev.error

    # 2. Later jobs fail too, even correct ones, on both sides; the message carries the first cause.
    later = RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 9), dst_buf=p.a.room(good_remote, 0, 32))
    recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 32))
    ev_later, ev_recv = p.run(later, recv)
    for failed in (ev_later, ev_recv):
        assert failed.status is DocaErrorCode.IO_FAILED
        assert failed.error is not None
        assert "flushed" in failed.error.message
        assert "WR_FLUSH_ERR" in failed.error.message
    assert ev_later.error is not None
    assert "refused access" in ev_later.error.message
    assert bytes(mem_b) == bytes(32)

    # 3. Recovery on both sides, then the same write succeeds.
    with pytest.raises(DocaError):
        p.a.rdma.connect(p.b.rdma.export())  # no shortcut: still RUNNING, in ERROR
    p.recover()
    assert p.a.rdma.error is None
    (ok,) = p.run(
        RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 9), dst_buf=p.a.room(good_remote, 0, 32))
    )
    assert ok.ok, ok.error
    assert bytes(mem_b[:9]) == b"first try"


def test_jobs_in_flight_behind_a_failure_are_flushed(make_pair: PairFactory) -> None:
    """IBTA §10.3.1 (Error state): work requests behind the failed one complete flushed, in order."""
    p = make_pair().up()
    mb, mem_b = p.b.mmap(64, WRITABLE)
    export = mb.export_rdma(p.b.dev)
    bad, good = _tampered(export, p), p.a.import_mmap(export)
    ma, _ = p.a.mmap(bytes(range(64)))
    jobs = [RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 8), dst_buf=p.a.room(bad, 0, 8))]
    jobs += [
        RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 8 * i, 8), dst_buf=p.a.room(good, 8 * i, 8))
        for i in range(1, 5)
    ]
    events = p.run(*jobs)
    assert events[0].error is not None
    assert events[0].error.code is DocaErrorCode.NOT_PERMITTED
    for ev in events[1:]:
        assert ev.status is DocaErrorCode.IO_FAILED
        assert ev.error is not None
        assert ev.error.code is DocaErrorCode.SHUTDOWN  # IBV_WC_WR_FLUSH_ERR
    assert bytes(mem_b) == bytes(64)


def test_workq_rm_waits_for_jobs_in_flight(make_pair: PairFactory) -> None:
    """DOCA Core 3.4 (doca_ctx_workq_rm): NOT_PERMITTED while jobs are in flight, so recovery drains first."""
    p = make_pair().up()
    recv = RdmaRecvJob(ctx=p.b.rdma)
    p.submit(recv)
    with pytest.raises(DocaError) as exc:
        p.b.rdma.workq_rm(p.b.wq)
    assert exc.value.code is DocaErrorCode.NOT_PERMITTED
    evs = p.run(RdmaSendJob(ctx=p.a.rdma, src_buf=None))
    assert evs[0].ok
    p.collect([recv])
    p.b.rdma.workq_rm(p.b.wq)


def test_message_larger_than_the_receive_buffer(make_pair: PairFactory) -> None:
    """Guide §5 (receive): the destination must have room for the message or the job fails (both sides)."""
    p = make_pair().up()
    mb, _ = p.b.mmap(4)
    ma, _ = p.a.mmap(b"too long for it")
    recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 4))
    ev_recv, ev_send = p.run(recv, RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 15)))
    assert ev_recv.error is not None
    assert ev_recv.error.code is DocaErrorCode.TOO_BIG
    assert "longer than the destination" in ev_recv.error.message
    assert ev_send.error is not None
    assert "does not fit the receive buffer" in ev_send.error.message
    assert p.a.rdma.rdma_state is RdmaState.ERROR
    assert p.b.rdma.rdma_state is RdmaState.ERROR


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_peer_that_went_away(transport: str, new_ip: Callable[[], str]) -> None:
    """A closed peer stops answering: the job fails when retries run out (IBV_WC_RETRY_EXC_ERR);
    over TCP the error says what the transport saw (a refused connection)."""
    p = Pair(transport, "event", new_ip)  # type: ignore[arg-type]
    try:
        p.up()
        mb, _ = p.b.mmap(8, WRITABLE)
        remote = p.share(mb)
        p.b.rdma.close()
        p.b.dev.close_all()  # the peer's process is gone: its mmaps with it
        ma, _ = p.a.mmap(b"anyone?!")
        (ev,) = p.run(RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 8), dst_buf=p.a.room(remote, 0, 8)))
        assert ev.error is not None
        assert ev.error.code is DocaErrorCode.TIME_OUT
        if transport == "udp":
            assert "stopped answering" in ev.error.message
        else:  # TCP knows why: nothing listens at the peer's address any more
            assert "connection refused by" in ev.error.message
            assert "retries" not in ev.error.message
        assert p.a.rdma.rdma_state is RdmaState.ERROR
    finally:
        p.close()
