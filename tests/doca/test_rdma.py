"""DOCA RDMA (RDMA guide ch. 4-6, doca_rdma.h): the context, its jobs and the sample flows.

Every test that moves data runs over both soft transports and both WorkQ
modes (`pair_cfg`). The DOCA samples (guide ch. 6, ``samples/doca_rdma``) are
reproduced with two contexts on two soft devices that swap descriptors, as
bytes and through files.
"""

import functools
import select
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest

from rdmakit.doca import (
    AccessFlag,
    BufInventory,
    CtxState,
    Dev,
    DocaError,
    DocaErrorCode,
    Event,
    Fault,
    JobType,
    Mmap,
    Rdma,
    RdmaAtomicCmpSwpJob,
    RdmaAtomicFetchAddJob,
    RdmaOpcode,
    RdmaReadJob,
    RdmaRecvJob,
    RdmaSendImmJob,
    RdmaSendJob,
    RdmaState,
    RdmaTransportType,
    RdmaWriteImmJob,
    RdmaWriteJob,
    WorkQ,
    local_devinfo,
)
from tests.doca.rdma_harness import ALL_RDMA, Pair, PairFactory, result
from tests.doca.util import error_code

RW = AccessFlag.LOCAL_READ_WRITE
Via = Literal["bytes", "files"]
VIAS = [pytest.param("bytes", id="bytes"), pytest.param("files", id="files")]


def _ctx_state(r: Rdma) -> CtxState:
    return r.state  # read again (mypy keeps an earlier assert's narrowing of the attribute)


def _rdma_state(r: Rdma) -> RdmaState:
    return r.rdma_state


# -- configuration -------------------------------------------------------------------------------


def test_configuration_is_idle_only(make_pair: PairFactory) -> None:
    """Guide §4 / doca_rdma.h: set_* is BAD_STATE once started; values are kept and rounded as DOCA does."""
    p = make_pair()
    r = p.a.rdma
    r.set_send_queue_size(100)
    r.set_recv_queue_size(3)
    r.set_recv_buf_chain_len(4)
    r.set_gid_index(0)
    r.set_transport_type(RdmaTransportType.RC)
    assert (r.send_queue_size, r.recv_queue_size) == (128, 4)  # "rounded to the next power of 2"
    assert (r.recv_buf_chain_len, r.gid_index, r.transport_type) == (4, 0, RdmaTransportType.RC)
    assert r.rdma_state is RdmaState.RESET
    r.start()
    for call in (
        lambda: r.set_permissions(ALL_RDMA),
        lambda: r.set_send_queue_size(8),
        lambda: r.set_recv_queue_size(8),
        lambda: r.set_recv_buf_chain_len(2),
        lambda: r.set_gid_index(0),
        lambda: r.set_transport_type(RdmaTransportType.RC),
    ):
        assert error_code(call) is DocaErrorCode.BAD_STATE


def test_invalid_configuration_is_refused(make_pair: PairFactory) -> None:
    """doca_rdma.h: non-RDMA permission flags and bad sizes are INVALID_VALUE; DC is NOT_SUPPORTED."""
    r = make_pair().a.rdma
    assert error_code(lambda: r.set_permissions(AccessFlag.PCI_READ_WRITE)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: r.set_permissions(-1)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: r.set_send_queue_size(0)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: r.set_recv_buf_chain_len(0)) is DocaErrorCode.INVALID_VALUE
    assert error_code(lambda: r.set_gid_index(1)) is DocaErrorCode.INVALID_VALUE  # a soft device has one GID
    assert error_code(lambda: r.set_transport_type(RdmaTransportType.DC)) is DocaErrorCode.NOT_SUPPORTED
    assert error_code(lambda: r.set_transport_type(7)) is DocaErrorCode.INVALID_VALUE
    assert r.transport_type is RdmaTransportType.RC
    assert r.permissions == RW


def test_queue_larger_than_the_device_fails_at_start(make_pair: PairFactory) -> None:
    """doca_rdma_set_send_queue_size: a size the device does not support is NOT_SUPPORTED (at start)."""
    r = make_pair().a.rdma
    r.set_send_queue_size(1 << 20)
    assert error_code(r.start) is DocaErrorCode.NOT_SUPPORTED
    assert r.state is CtxState.IDLE
    r.set_send_queue_size(16)
    r.start()
    assert _ctx_state(r) is CtxState.STARTING


def test_device_without_rdma_is_not_supported() -> None:
    """doca_rdma_job_get_supported: a DMA-only device runs no RDMA jobs, and an RDMA context refuses it."""
    info = local_devinfo()
    assert error_code(lambda: Rdma.job_get_supported(info, JobType.RDMA_SEND)) is DocaErrorCode.NOT_SUPPORTED
    with Dev.open(info) as dev, Rdma() as r:
        assert error_code(lambda: r.add_dev(dev)) is DocaErrorCode.NOT_SUPPORTED
        assert error_code(r.start) is DocaErrorCode.INVALID_VALUE  # no device


def test_one_device_per_context(make_pair: PairFactory) -> None:
    """An RDMA context drives one device (doca_rdma: one connection on one port)."""
    p = make_pair()
    assert error_code(lambda: p.a.rdma.add_dev(p.b.dev)) is DocaErrorCode.NOT_SUPPORTED


# -- lifecycle ---------------------------------------------------------------------------------


def test_start_is_starting_until_connect(make_pair: PairFactory) -> None:
    """Guide §4 (DOCA 2.5+ samples): start leaves the context STARTING, rdma state INIT; connect: RUNNING."""
    p = make_pair()
    assert error_code(p.a.rdma.export) is DocaErrorCode.BAD_STATE  # only after start
    assert error_code(lambda: p.a.rdma.connect(b"{}")) is DocaErrorCode.BAD_STATE
    p.start()
    for s in p.sides:
        assert (s.rdma.state, s.rdma.rdma_state) == (CtxState.STARTING, RdmaState.INIT)
    ma, _ = p.a.mmap(b"x")
    send = RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 1))
    assert error_code(lambda: p.submit(send)) is DocaErrorCode.BAD_STATE  # not connected yet
    p.connect()
    for s in p.sides:
        assert (s.rdma.state, s.rdma.rdma_state) == (CtxState.RUNNING, RdmaState.CONNECTED)
    assert error_code(lambda: p.a.rdma.connect(p.b.rdma.export())) is DocaErrorCode.BAD_STATE  # twice


def test_state_callback_drives_the_connection(make_pair: PairFactory) -> None:
    """DOCA 2.5+ samples (rdma_*_state_change_callback): export and connect from the STARTING callback."""
    p = make_pair()
    p.b.rdma.start()
    seen: list[tuple[CtxState, CtxState]] = []

    def on_change(user_data: object, ctx: object, prev: CtxState, nxt: CtxState) -> None:
        seen.append((prev, nxt))
        if nxt is CtxState.STARTING:
            p.a.rdma.connect(p.b.rdma.export())

    p.a.rdma.set_state_changed_cb(on_change)
    p.a.rdma.start()
    p.b.rdma.connect(p.a.rdma.export())
    p.a.rdma.workq_rm(p.a.wq)  # DOCA 2.0 doca_ctx_stop: NOT_PERMITTED while a WorkQ is attached
    p.a.rdma.stop()
    assert seen == [
        (CtxState.IDLE, CtxState.STARTING),
        (CtxState.STARTING, CtxState.RUNNING),
        (CtxState.RUNNING, CtxState.STOPPING),
        (CtxState.STOPPING, CtxState.IDLE),
    ]


def test_receive_may_be_posted_before_connect(make_pair: PairFactory) -> None:
    """Guide §5 (receive): submitted before the peer's send, even before connecting (the QP is in INIT)."""
    p = make_pair()
    p.start()
    mb, mem_b = p.b.mmap(32)
    recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 32))
    p.submit(recv)
    assert p.b.rdma.num_inflight == 1
    p.connect()
    ma, _ = p.a.mmap(b"early bird")
    (ev_send,) = p.run(RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 10)))
    ev_recv = p.collect([recv])[id(recv)]
    assert ev_send.ok
    assert ev_recv.ok
    assert bytes(mem_b[:10]) == b"early bird"


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_a_job_resubmitted_to_a_queue_pair_in_error_is_delivered_by_its_submit(
    transport: str, new_ip: Callable[[], str]
) -> None:
    """IBTA §10.3.1 (``ibv_post_send`` in ERR): the request completes at once, flushed. A job
    submitted again to its queue pair in error (its kept plan posted as is) gets its event from
    the submit itself: the WorkQ armed right after it is readable with no progress between."""
    p = Pair(transport, "event", new_ip)  # type: ignore[arg-type]
    try:
        p.up()
        mb, _ = p.b.mmap(8, RW | AccessFlag.RDMA_WRITE)
        remote = p.share(mb, "bytes", None)
        ma, _ = p.a.mmap(b"flushed!")
        job = RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 8), dst_buf=p.a.room(remote, 0, 8))
        (ev,) = p.run(job)
        assert ev.ok
        job.dst_buf.set_data(job.dst_buf.addr, 0)
        qp = p.a.rdma._qp
        assert qp is not None
        qp.to_error()  # as a transport fault would
        p.a.wq.submit(job)
        p.a.wq.arm()
        assert select.select([p.a.wq.fileno()], [], [], 0)[0]
        got = p.a.wq.progress_retrieve()
        assert got is not None
        assert got.job is job
        assert not got.ok
    finally:
        p.close()


def test_stop_flushes_and_resets(make_pair: PairFactory) -> None:
    """DOCA 2.0 ``doca_ctx.h``: stop is NOT_PERMITTED while "some jobs are still pending or not all
    WorkQs have been removed"; once the job is done and the WorkQ removed, the stop resets the
    connection (guide §4 note: it must be redone)."""
    p = make_pair().up()
    mb, _ = p.b.mmap(8)
    recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 8))
    p.submit(recv)
    assert error_code(p.b.rdma.stop) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: p.b.rdma.workq_rm(p.b.wq)) is DocaErrorCode.NOT_PERMITTED
    ma, _ = p.a.mmap(b"x")
    p.run(RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 1)))
    (ev,) = p.collect([recv]).values()
    assert ev.ok
    p.b.rdma.workq_rm(p.b.wq)
    assert p.b.rdma.stop() is DocaErrorCode.SUCCESS
    assert (p.b.rdma.state, p.b.rdma.rdma_state) == (CtxState.IDLE, RdmaState.RESET)


def test_reconnect_after_stop_with_new_descriptors(make_pair: PairFactory) -> None:
    """doca_rdma_export note: stopping and restarting requires export and connect again; the PSN is new."""
    p = make_pair().up()
    old = p.a.rdma.export()
    p.recover()
    assert p.a.rdma.export() != old
    ma, _ = p.a.mmap(b"again")
    mb, mem_b = p.b.mmap(8)
    evs = p.run(
        RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 8)),
        RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 5)),
    )
    assert all(ev.ok for ev in evs)
    assert bytes(mem_b[:5]) == b"again"


# -- the DOCA samples (guide ch. 6) ------------------------------------------------------------------


@pytest.mark.parametrize("via", VIAS)
def test_sample_read(make_pair: PairFactory, via: Via, tmp_path: Path) -> None:
    """Guide ch. 6 rdma_read_requester/responder: the responder exports an RDMA_READ mmap, read remotely."""
    p = make_pair(perms_b=RW | AccessFlag.RDMA_READ).up(via, tmp_path)
    mb, _ = p.b.mmap(b"Hi from the responder\0" + bytes(10), RW | AccessFlag.RDMA_READ)
    remote = p.share(mb, via, tmp_path)
    ma, mem_a = p.a.mmap(64)
    dst = p.a.room(ma, 0, 64)
    (ev,) = p.run(RdmaReadJob(ctx=p.a.rdma, src_buf=p.a.data(remote, 0, 22), dst_buf=dst))
    assert ev.ok, ev.error
    assert result(ev).length == 22
    assert bytes(mem_a[:22]) == b"Hi from the responder\0"
    assert dst.data_len == 22  # appended


@pytest.mark.parametrize("via", VIAS)
def test_sample_write(make_pair: PairFactory, via: Via, tmp_path: Path) -> None:
    """Guide ch. 6 rdma_write_requester/responder: responder mmap and context LOCAL_READ_WRITE|RDMA_WRITE."""
    p = make_pair(perms_b=RW | AccessFlag.RDMA_WRITE).up(via, tmp_path)
    mb, mem_b = p.b.mmap(256, RW | AccessFlag.RDMA_WRITE)
    remote = p.share(mb, via, tmp_path)
    ma, _ = p.a.mmap(b"Hi from the requester\0")
    dst = p.a.room(remote, 0, 256)
    (ev,) = p.run(RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 22), dst_buf=dst))
    assert ev.ok, ev.error
    assert result(ev).length == 22
    assert result(ev).opcode is None
    assert bytes(mem_b[:22]) == b"Hi from the requester\0"
    assert dst.data_len == 22


@pytest.mark.parametrize("via", VIAS)
def test_sample_write_immediate(make_pair: PairFactory, via: Via, tmp_path: Path) -> None:
    """Guide ch. 6 rdma_write_immediate: the responder's bufferless receive gets opcode write-imm, 0xABCD."""
    p = make_pair(perms_b=AccessFlag.RDMA_WRITE).up(via, tmp_path)
    mb, mem_b = p.b.mmap(256, RW | AccessFlag.RDMA_WRITE)
    remote = p.share(mb, via, tmp_path)
    ma, _ = p.a.mmap(b"written with an immediate")
    recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=None)
    write = RdmaWriteImmJob(
        ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 25), dst_buf=p.a.room(remote, 0, 256), immediate=0xABCD
    )
    ev_recv, ev_write = p.run(recv, write)
    assert ev_write.ok, ev_write.error
    assert ev_recv.ok, ev_recv.error
    assert result(ev_recv).opcode is RdmaOpcode.RECV_WRITE_WITH_IMM
    assert result(ev_recv).immediate == 0xABCD
    assert result(ev_recv).length == 25
    assert bytes(mem_b[:25]) == b"written with an immediate"


@pytest.mark.parametrize("via", VIAS)
def test_sample_send_receive(make_pair: PairFactory, via: Via, tmp_path: Path) -> None:
    """Guide ch. 6 rdma_send / rdma_receive: the message is appended to the receive buffer; opcode send."""
    p = make_pair(perms_b=RW).up(via, tmp_path)
    mb, mem_b = p.b.mmap(64)
    dst = p.b.room(mb, 0, 64)
    dst.set_data(dst.addr, 0)
    ma, _ = p.a.mmap(b"Hi from sender")
    ev_recv, ev_send = p.run(
        RdmaRecvJob(ctx=p.b.rdma, dst_buf=dst), RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 14))
    )
    assert ev_send.ok
    assert ev_recv.ok
    assert result(ev_recv).opcode is RdmaOpcode.RECV_SEND
    assert (result(ev_recv).length, result(ev_recv).immediate) == (14, None)
    assert bytes(mem_b[:14]) == b"Hi from sender"
    assert dst.data_len == 14


@pytest.mark.parametrize("via", VIAS)
def test_sample_send_receive_immediate(make_pair: PairFactory, via: Via, tmp_path: Path) -> None:
    """Guide ch. 6 rdma_send_immediate / rdma_receive_immediate: opcode send-imm, the immediate as sent."""
    p = make_pair(perms_b=RW).up(via, tmp_path)
    mb, mem_b = p.b.mmap(64)
    ma, _ = p.a.mmap(b"Hi with imm")
    recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 64))
    send = RdmaSendImmJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 11), immediate=0xABCD)
    ev_recv, ev_send = p.run(recv, send)
    assert ev_send.ok
    assert ev_recv.ok
    assert result(ev_recv).opcode is RdmaOpcode.RECV_SEND_WITH_IMM
    assert result(ev_recv).immediate == 0xABCD
    assert bytes(mem_b[:11]) == b"Hi with imm"


def test_immediate_is_the_big_endian_wire_value(make_pair: PairFactory) -> None:
    """doca_rdma.h: immediate_data is doca_be32_t: the value arrives unchanged, its wire bytes big-endian."""
    p = make_pair().up()
    recv = RdmaRecvJob(ctx=p.b.rdma)
    send = RdmaSendImmJob(ctx=p.a.rdma, src_buf=None, immediate=0x12345678)
    ev_recv, _ = p.run(recv, send)
    assert result(ev_recv).immediate == 0x12345678
    assert result(ev_recv).immediate_bytes == b"\x12\x34\x56\x78"
    assert result(ev_recv).length == 0  # an empty message needs no receive buffer
    assert (
        error_code(lambda: p.submit(RdmaSendImmJob(ctx=p.a.rdma, immediate=1 << 32)))
        is DocaErrorCode.INVALID_VALUE
    )


def test_atomic_compare_and_swap(make_pair: PairFactory) -> None:
    """Guide §5 (atomic CAS): swapped when equal, untouched otherwise; result_buf gets the original value."""
    p = make_pair(perms_b=RW | AccessFlag.RDMA_ATOMIC).up()
    mb, mem_b = p.b.mmap(16, RW | AccessFlag.RDMA_ATOMIC)
    mem_b[8:16] = (7).to_bytes(8, sys.byteorder)
    remote = p.share(mb)
    ma, mem_a = p.a.mmap(16)
    out = p.a.room(ma, 0, 16)
    word = p.a.data(remote, 8, 8)
    (hit,) = p.run(RdmaAtomicCmpSwpJob(ctx=p.a.rdma, dst_buf=word, result_buf=out, cmp=7, swap=42))
    (miss,) = p.run(RdmaAtomicCmpSwpJob(ctx=p.a.rdma, dst_buf=word, result_buf=out, cmp=7, swap=99))
    assert hit.ok
    assert miss.ok
    assert int.from_bytes(mem_b[8:16], sys.byteorder) == 42
    assert int.from_bytes(mem_a[0:8], sys.byteorder) == 7  # the first original value
    assert int.from_bytes(mem_a[8:16], sys.byteorder) == 42  # the second, appended
    assert out.data_len == 16
    assert result(hit).length == 8


def test_atomic_fetch_and_add(make_pair: PairFactory) -> None:
    """Guide §5 (atomic fetch-add): the remote word grows (mod 2**64); result_buf gets the value before."""
    p = make_pair(perms_b=RW | AccessFlag.RDMA_ATOMIC).up()
    mb, mem_b = p.b.mmap(8, RW | AccessFlag.RDMA_ATOMIC)
    mem_b[:] = ((1 << 64) - 2).to_bytes(8, sys.byteorder)
    remote = p.share(mb)
    ma, mem_a = p.a.mmap(8)
    (ev,) = p.run(
        RdmaAtomicFetchAddJob(
            ctx=p.a.rdma, dst_buf=p.a.data(remote, 0, 8), result_buf=p.a.room(ma, 0, 8), add=5
        )
    )
    assert ev.ok, ev.error
    assert int.from_bytes(mem_a, sys.byteorder) == (1 << 64) - 2
    assert int.from_bytes(mem_b, sys.byteorder) == 3  # wrapped


def test_atomic_buffer_rules_are_checked_at_submit(make_pair: PairFactory) -> None:
    """Guide §5 (atomics): an 8-byte aligned remote word, 8 bytes of room in result_buf, u64 operands."""
    p = make_pair().up()
    mb, _ = p.b.mmap(32, RW | AccessFlag.RDMA_ATOMIC)
    remote = p.share(mb)
    ma, _ = p.a.mmap(16)
    r = p.a.rdma
    cases = [
        RdmaAtomicFetchAddJob(ctx=r, dst_buf=p.a.data(remote, 4, 8), result_buf=p.a.room(ma, 0, 8), add=1),
        RdmaAtomicFetchAddJob(ctx=r, dst_buf=p.a.data(remote, 8, 8), result_buf=p.a.room(ma, 0, 4), add=1),
        RdmaAtomicFetchAddJob(ctx=r, dst_buf=p.a.data(remote, 8, 8), result_buf=p.a.room(ma, 0, 8), add=-1),
        RdmaAtomicCmpSwpJob(
            ctx=r, dst_buf=p.a.data(remote, 8, 8), result_buf=p.a.room(ma, 0, 8), cmp=0, swap=1 << 64
        ),
    ]
    for job in cases:
        assert error_code(functools.partial(p.submit, job)) is DocaErrorCode.INVALID_VALUE
    assert r.rdma_state is RdmaState.CONNECTED
    assert r.num_inflight == 0


# -- buffers: data sections, appends, chains ------------------------------------------------------


def test_read_length_is_min_of_source_data_and_destination_room(make_pair: PairFactory) -> None:
    """Guide §5 (read): min(source data length, destination room) bytes, appended after existing data."""
    p = make_pair().up()
    mb, _ = p.b.mmap(bytes(range(64)), RW | AccessFlag.RDMA_READ)
    remote = p.share(mb)
    ma, mem_a = p.a.mmap(64)
    dst = p.a.inv.get_by_args(ma, ma.addr, 16, ma.addr, 4)  # 4 bytes of data, 12 of room
    (short,) = p.run(RdmaReadJob(ctx=p.a.rdma, src_buf=p.a.data(remote, 10, 40), dst_buf=dst))
    assert short.ok
    assert result(short).length == 12
    assert bytes(mem_a[4:16]) == bytes(range(10, 22))
    assert dst.data_len == 16
    big = p.a.room(ma, 32, 32)
    (small,) = p.run(RdmaReadJob(ctx=p.a.rdma, src_buf=p.a.data(remote, 0, 5), dst_buf=big))
    assert small.ok
    assert result(small).length == 5
    assert big.data_len == 5
    assert bytes(mem_a[32:37]) == bytes(range(5))


def test_writes_append_to_the_remote_destination(make_pair: PairFactory) -> None:
    """Guide §5 (write): the destination is appended to; a write that does not fit is INVALID_VALUE."""
    p = make_pair().up()
    mb, mem_b = p.b.mmap(10, RW | AccessFlag.RDMA_WRITE)
    remote = p.share(mb)
    ma, _ = p.a.mmap(b"abcdefgh")
    dst = p.a.room(remote, 0, 10)
    p.run(RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 3), dst_buf=dst))
    p.run(RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 3, 4), dst_buf=dst))
    assert bytes(mem_b[:7]) == b"abcdefg"
    assert dst.data_len == 7
    too_big = RdmaWriteJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 8), dst_buf=dst)
    assert error_code(lambda: p.submit(too_big)) is DocaErrorCode.INVALID_VALUE
    assert p.a.rdma.rdma_state is RdmaState.CONNECTED


def test_chains_gather_and_scatter(make_pair: PairFactory) -> None:
    """DOCA Core 3.3 buffer lists: a source chain is gathered; a receive chain is filled in order."""
    p = make_pair(configure=lambda r: r.set_recv_buf_chain_len(2))
    p.up()
    ma, _ = p.a.mmap(b"HEADER|payload|trailer")
    src = p.a.data(ma, 0, 7)
    src.chain_list(p.a.data(ma, 7, 8))
    src.chain_list(p.a.data(ma, 15, 7))
    mb, mem_b = p.b.mmap(32)
    d1, d2 = p.b.room(mb, 0, 6), p.b.room(mb, 16, 16)
    d1.chain_list(d2)
    ev_recv, ev_send = p.run(RdmaRecvJob(ctx=p.b.rdma, dst_buf=d1), RdmaSendJob(ctx=p.a.rdma, src_buf=src))
    assert ev_send.ok
    assert ev_recv.ok
    assert result(ev_recv).length == 22
    assert bytes(mem_b[:6]) + bytes(mem_b[16:32]) == b"HEADER|payload|trailer"
    assert (d1.data_len, d2.data_len) == (6, 16)
    d3 = p.b.room(mb, 0, 1)
    d3.chain_list(p.b.room(mb, 1, 1))
    d3.chain_list(p.b.room(mb, 2, 1))
    assert error_code(lambda: p.submit(RdmaRecvJob(ctx=p.b.rdma, dst_buf=d3))) is DocaErrorCode.INVALID_VALUE


def test_read_scatters_along_a_destination_chain(make_pair: PairFactory) -> None:
    """Guide §5 (read) with a destination list: the room of every element counts."""
    p = make_pair().up()
    mb, _ = p.b.mmap(b"0123456789", RW | AccessFlag.RDMA_READ)
    remote = p.share(mb)
    ma, mem_a = p.a.mmap(16)
    d1, d2 = p.a.room(ma, 0, 3), p.a.room(ma, 8, 8)
    d1.chain_list(d2)
    (ev,) = p.run(RdmaReadJob(ctx=p.a.rdma, src_buf=p.a.data(remote, 0, 10), dst_buf=d1))
    assert ev.ok
    assert result(ev).length == 10
    assert bytes(mem_a[:3]) == b"012"
    assert bytes(mem_a[8:15]) == b"3456789"


def test_buffers_on_the_wrong_side_are_refused(make_pair: PairFactory) -> None:
    """Guide §5: a remote buffer comes from Mmap.create_from_export, a local one from this device's mmap."""
    p = make_pair().up()
    mb, _ = p.b.mmap(16, RW | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_READ)
    remote = p.share(mb)
    ma, _ = p.a.mmap(16)
    r = p.a.rdma
    local_src, local_dst = p.a.data(ma, 0, 4), p.a.room(ma, 8, 8)
    remote_src, remote_dst = p.a.data(remote, 0, 4), p.a.room(remote, 0, 16)
    wrong = [
        RdmaWriteJob(ctx=r, src_buf=local_src, dst_buf=local_dst),  # destination is local
        RdmaWriteJob(ctx=r, src_buf=remote_src, dst_buf=remote_dst),  # source is remote
        RdmaReadJob(ctx=r, src_buf=local_src, dst_buf=local_dst),  # source is local
        RdmaSendJob(ctx=r, src_buf=remote_src),  # a send's source is local
    ]
    for job in wrong:
        with pytest.raises(DocaError) as exc:
            p.submit(job)
        assert exc.value.code is DocaErrorCode.INVALID_VALUE
        assert "remote" in exc.value.message
    other = Mmap()  # registered on b's device only
    other.set_memrange(bytearray(8))
    other.add_dev(p.b.dev)
    other.start()
    inv = BufInventory(1)
    inv.start()
    job = RdmaSendJob(ctx=r, src_buf=inv.get_by_data(other, other.addr, 8))
    assert error_code(lambda: p.submit(job)) is DocaErrorCode.NOT_FOUND
    assert r.rdma_state is RdmaState.CONNECTED
    assert r.num_inflight == 0


# -- connection descriptors at connect ----------------------------------------------------------------


def test_connect_rejects_bad_descriptors_naming_the_field(make_pair: PairFactory) -> None:
    """doca_rdma_connect: a corrupted descriptor is CONNECTION_ABORTED ("if connection failed or
    connection details object was corrupted") naming the field, and nothing connects."""
    p = make_pair()
    p.start()
    good = p.b.rdma.export()
    tampered = good.replace(b'"qpn":', b'"qpn":-')
    mb, _ = p.b.mmap(8, RW | AccessFlag.RDMA_READ)
    for bad, field in ((good[:-5], "descriptor"), (tampered, "qpn"), (mb.export_rdma(p.b.dev), "format")):
        with pytest.raises(DocaError) as exc:
            p.a.rdma.connect(bad)
        assert exc.value.code is DocaErrorCode.CONNECTION_ABORTED
        assert exc.value.fault is Fault.PEER
        assert repr(field) in exc.value.message
    assert p.a.rdma.rdma_state is RdmaState.INIT
    p.a.rdma.connect(good)
    assert _rdma_state(p.a.rdma) is RdmaState.CONNECTED


def test_transports_do_not_mix(new_ip: Callable[[], str]) -> None:
    """A soft UDP device speaks RoCEv2, a TCP one framed packets: connecting them is NOT_SUPPORTED."""
    udp = Pair("udp", "poll", new_ip)
    tcp = Pair("tcp", "poll", new_ip)
    try:
        udp.start()
        tcp.start()
        with pytest.raises(DocaError) as exc:
            udp.a.rdma.connect(tcp.a.rdma.export())
        assert exc.value.code is DocaErrorCode.NOT_SUPPORTED
        assert b'"transport":"tcp"' in tcp.a.rdma.export()
        assert b'"transport":"roce-udp"' in udp.a.rdma.export()
    finally:
        udp.close()
        tcp.close()


# -- event-driven mode ----------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_event_handle_works_with_select(transport: Literal["udp", "tcp"], new_ip: Callable[[], str]) -> None:
    """DOCA Core 3.4 (doca_workq_event_handle_arm): the handle is a descriptor select() waits on."""
    p = Pair(transport, "event", new_ip, waiter="select")
    try:
        p.up()
        ma, _ = p.a.mmap(b"selected")
        mb, mem_b = p.b.mmap(8)
        evs = p.run(
            RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 8)),
            RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 8)),
        )
        assert all(ev.ok for ev in evs)
        assert bytes(mem_b) == b"selected"
    finally:
        p.close()


@pytest.mark.parametrize("transport", ["udp", "tcp"])
def test_no_lost_wakeup_across_work_queues(
    transport: Literal["udp", "tcp"], new_ip: Callable[[], str]
) -> None:
    """Two WorkQs, one soft driver: when a's progress completes b's receive, b's armed handle fires."""
    p = Pair(transport, "event", new_ip)
    try:
        p.up()
        mb, _ = p.b.mmap(8)
        recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 8))
        p.b.wq.submit(recv)
        assert p.b.wq.progress_retrieve() is None
        p.b.wq.arm()
        ma, _ = p.a.mmap(b"wake b")
        send = RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 6))
        p.a.wq.submit(send)
        ev_a = None
        while ev_a is None:  # drive only a's WorkQ
            ev_a = p.a.wq.progress_retrieve()
            if ev_a is None:
                p.a.wq.arm()
                select.select([p.a.wq.fileno()], [], [], 5.0)
                p.a.wq.clear()
        assert ev_a.ok
        ready, _, _ = select.select([p.b.wq.fileno()], [], [], 5.0)
        assert ready == [p.b.wq.fileno()]
        p.b.wq.clear()
        ev_b = p.b.wq.progress_retrieve()
        assert ev_b is not None
        assert ev_b.job is recv
        assert ev_b.ok
    finally:
        p.close()


def test_shared_workq_serves_both_contexts(new_ip: Callable[[], str]) -> None:
    """DOCA Core 3.4: one WorkQ may serve several contexts; each event names its job."""
    p = Pair("udp", "event", new_ip)
    try:
        p.b.rdma.workq_rm(p.b.wq)
        p.b.rdma.workq_add(p.a.wq)
        p.up()
        ma, _ = p.a.mmap(b"one queue")
        mb, mem_b = p.b.mmap(16)
        recv = RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 16))
        send = RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 9))
        p.a.wq.submit(recv)
        p.a.wq.submit(send)
        got: dict[int, Event] = {}
        while len(got) < 2:
            ev = p.a.wq.progress_retrieve()
            if ev is None:
                p.a.wq.arm()
                assert select.select([p.a.wq.fileno()], [], [], 5.0)[0], "no wakeup"
                p.a.wq.clear()
                continue
            got[id(ev.job)] = ev
        assert got[id(recv)].ok
        assert got[id(send)].ok
        assert bytes(mem_b[:9]) == b"one queue"
    finally:
        p.close()


def test_contexts_clean_up_on_close(new_ip: Callable[[], str]) -> None:
    """DOCA Core 3.4: closing a context detaches it and frees its queue pair. doca_dev_close is IN_USE
    while the context uses the device; close_all closes the context first."""
    p = Pair("udp", "poll", new_ip).up()
    qpn = p.a.rdma.qpn
    assert qpn is not None
    assert error_code(p.a.dev.close) is DocaErrorCode.IN_USE
    assert not p.a.rdma.closed
    p.a.dev.close_all()
    assert p.a.rdma.closed
    assert p.a.rdma.qpn is None
    assert p.a.wq.ctxs == ()
    p.close()
    wq = WorkQ(4)
    wq.close()
