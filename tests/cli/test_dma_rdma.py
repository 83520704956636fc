"""dma-copy's DMA jobs over RDMA: memory on another machine (``export_rdma``) through `DmaOverRdma.set_rdma`.

Two soft devices on distinct loopback addresses play the two machines: the
exporter ("host") holds memory and answers RDMA requests; the copier ("DPU")
runs a `Dma` context whose RDMA connection reaches that memory. The buffer
rules are the local ones (tests/doca/test_dma.py); these tests check they
hold when a side is remote, and the errors only a remote side has.
"""

import select
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from rdmakit.cli.dma_rdma import DmaOverRdma
from rdmakit.doca import (
    AccessFlag,
    Buf,
    BufInventory,
    CtxState,
    Dev,
    DmaMemcpyJob,
    DocaError,
    DocaErrorCode,
    Event,
    Mmap,
    Rdma,
    RdmaState,
    WorkQ,
)
from tests.doca.util import error_code

REMOTE_RW = AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE
#: Progress calls a test allows a job before calling it hung (no wall-clock limit).
MAX_ROUNDS = 200_000


@dataclass
class Link:
    """The exporter's device and Rdma context, the copier's device, Rdma, Dma and WorkQ."""

    host: Dev
    host_rdma: Rdma
    dpu: Dev
    rdma: Rdma
    dma: DmaOverRdma
    wq: WorkQ
    inv: BufInventory
    mmaps: list[Mmap] = field(default_factory=list)

    def host_mmap(self, memory: bytearray, perms: int = REMOTE_RW) -> Mmap:
        """Memory on the host, exported for RDMA and imported on the DPU."""
        m = Mmap()
        m.set_permissions(perms)
        m.set_memrange(memory)
        m.add_dev(self.host)
        m.start()
        self.mmaps.append(m)
        remote = Mmap.create_from_export(m.export_rdma(self.host), self.dpu)
        self.mmaps.append(remote)
        return remote

    def dpu_mmap(self, memory: bytearray, perms: int = AccessFlag.LOCAL_READ_WRITE) -> Mmap:
        m = Mmap()
        m.set_permissions(perms)
        m.set_memrange(memory)
        m.add_dev(self.dpu)
        m.start()
        self.mmaps.append(m)
        return m

    def buf(self, mmap: Mmap, offset: int, length: int, data_off: int = 0, data_len: int = 0) -> Buf:
        return self.inv.get_by_args(mmap, mmap.addr + offset, length, mmap.addr + offset + data_off, data_len)

    def submit(self, src: Buf, dst: Buf, user_data: object = None) -> DmaMemcpyJob:
        job = DmaMemcpyJob(ctx=self.dma, src=src, dst=dst, user_data=user_data)
        self.wq.submit(job)
        return job

    def events(self, n: int) -> list[Event]:
        """The next `n` events, waiting on the WorkQ's event handle between drains."""
        got: list[Event] = []
        for _ in range(MAX_ROUNDS):
            while len(got) < n and (ev := self.wq.progress_retrieve()) is not None:
                got.append(ev)
            if len(got) == n:
                return got
            self.wq.arm()
            # A wait that never wakes is a lost wakeup (engine timers wake it too), not a slow run.
            assert select.select([self.wq.fileno()], [], [], 20.0)[0], "lost wakeup"
            self.wq.clear()
        raise AssertionError(f"{n - len(got)} of {n} jobs never completed")

    def run(self, src: Buf, dst: Buf) -> Event:
        self.submit(src, dst)
        return self.events(1)[0]


def _open_link(new_ip: Callable[[], str], host_perms: int = REMOTE_RW, sq: int = 64) -> Link:
    host, dpu = Dev.open(new_ip()), Dev.open(new_ip())
    host_rdma, rdma = Rdma(), Rdma()
    host_rdma.add_dev(host)
    host_rdma.set_permissions(host_perms)
    rdma.add_dev(dpu)
    rdma.set_send_queue_size(sq)
    host_rdma.start()
    rdma.start()
    host_rdma.connect(rdma.export())
    rdma.connect(host_rdma.export())
    dma = DmaOverRdma(dpu)
    wq = WorkQ(64, event_driven=True)
    dma.workq_add(wq)
    dma.set_rdma(rdma)
    dma.start()
    inv = BufInventory(128)
    inv.start()
    return Link(host, host_rdma, dpu, rdma, dma, wq, inv)


def _close_link(link: Link) -> None:
    for step in (link.dma.close, link.wq.close, link.rdma.close, link.host_rdma.close):
        step()
    link.dpu.close_all()  # teardown: what a test left goes with the devices
    link.host.close_all()


@pytest.fixture
def link(new_ip: Callable[[], str]) -> Iterator[Link]:
    made = _open_link(new_ip)
    yield made
    _close_link(made)


def chain(*bufs: Buf) -> Buf:
    for buf in bufs[1:]:
        bufs[0].chain_list(buf)
    return bufs[0]


# -- the buffer rules, one side remote ----------------------------------------------------------


def test_remote_destination_is_an_rdma_write_appended_at_the_tail(link: Link) -> None:
    """Source data section -> tail of the remote destination; its data_len grows, its head stays."""
    host_mem = bytearray(b"old:" + bytes(20))
    remote = link.host_mmap(host_mem)
    src_mem = bytearray(b"HEAD" + b"payload!" + b"TAIL")
    src = link.buf(link.dpu_mmap(src_mem), 0, 16, 4, 8)
    dst = link.buf(remote, 0, 24, 0, 4)
    event = link.run(src, dst)
    assert event.ok, event.error
    assert event.result == 8
    assert host_mem == bytearray(b"old:payload!" + bytes(12))
    assert (dst.data, dst.data_len) == (remote.addr, 12)
    assert src.data_len == 8
    assert link.rdma.rdma_state is RdmaState.CONNECTED


def test_remote_source_is_an_rdma_read(link: Link) -> None:
    host_mem = bytearray(b"xx" + b"remote bytes" + b"yy")
    src = link.buf(link.host_mmap(host_mem), 0, 16, 2, 12)
    dst_mem = bytearray(b"ab" + bytes(14))
    dst = link.buf(link.dpu_mmap(dst_mem), 0, 16, 0, 2)
    event = link.run(src, dst)
    assert event.ok, event.error
    assert event.result == 12
    assert dst_mem == bytearray(b"abremote bytes" + bytes(2))
    assert dst.data_len == 14
    assert host_mem == bytearray(b"xxremote bytesyy")


# (source element data lengths, destination element (length, data_len)) -> pieces gathered and scattered
CHAINS = [
    pytest.param([5, 0, 7, 4], [(16, 0)], id="gather-into-one"),
    pytest.param([16], [(3, 0), (5, 0), (8, 0)], id="scatter-from-one"),
    pytest.param([3, 9, 4], [(4, 2), (6, 0), (10, 0)], id="gather-scatter-appended"),
    pytest.param([1, 1, 1, 1], [(2, 0), (2, 0)], id="one-byte-pieces"),
]


@pytest.mark.parametrize("remote_side", ["dst", "src"])
@pytest.mark.parametrize(("src_lens", "dst_shape"), CHAINS)
def test_chains_gather_and_scatter_over_rdma(
    link: Link, remote_side: str, src_lens: list[int], dst_shape: list[tuple[int, int]]
) -> None:
    """The list rules of local DMA, with either list on the other machine."""
    total = sum(src_lens)
    src_bytes = bytes((7 * i + 1) % 256 for i in range(total))
    src_mem = bytearray(
        b"#"
        + b"#".join(src_bytes[sum(src_lens[:i]) : sum(src_lens[: i + 1])] for i in range(len(src_lens)))
        + b"#"
    )
    dst_len = sum(n for n, _ in dst_shape)
    dst_mem = bytearray(b"=" * dst_len)
    if remote_side == "dst":
        src_mmap, dst_mmap = link.dpu_mmap(src_mem), link.host_mmap(dst_mem)
    else:
        src_mmap, dst_mmap = link.host_mmap(src_mem), link.dpu_mmap(dst_mem)
    srcs, off = [], 1
    for n in src_lens:
        srcs.append(link.buf(src_mmap, off, n, 0, n))
        off += n + 1
    dsts, off = [], 0
    for n, have in dst_shape:
        dsts.append(link.buf(dst_mmap, off, n, 0, have))
        off += n
    before = [b.data_len for b in dsts]
    event = link.run(chain(*srcs), chain(*dsts))
    assert event.ok, event.error
    assert event.result == total
    # Old data, then the copy, across the elements from the last one holding data.
    old = b"".join(dst_mem[o : o + h] for o, (_, h) in zip(_offsets(dst_shape), dst_shape, strict=True))
    got = b"".join(bytes(dst_mem[o : o + b.data_len]) for o, b in zip(_offsets(dst_shape), dsts, strict=True))
    assert got == old + src_bytes
    assert sum(b.data_len for b in dsts) - sum(before) == total
    assert dst_mem[sum(b.data_len for b in dsts) :] == b"=" * (dst_len - sum(b.data_len for b in dsts))


def _offsets(shape: list[tuple[int, int]]) -> list[int]:
    out, off = [], 0
    for n, _ in shape:
        out.append(off)
        off += n
    return out


def test_local_to_local_needs_no_connected_rdma(link: Link) -> None:
    """With a connection given but not connected, local memory still copies (a memcpy)."""
    rdma = Rdma()
    rdma.add_dev(link.dpu)
    with rdma, DmaOverRdma(link.dpu) as dma, WorkQ(4) as wq:
        dma.set_rdma(rdma)
        dma.workq_add(wq)
        dma.start()
        src = link.buf(link.dpu_mmap(bytearray(b"local")), 0, 5, 0, 5)
        dst_mem = bytearray(5)
        wq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=link.buf(link.dpu_mmap(dst_mem), 0, 5)))
        event = wq.progress_retrieve()
        assert event is not None
        assert event.ok
        assert dst_mem == b"local"
        assert rdma.rdma_state is RdmaState.RESET


def test_a_destination_list_mixing_local_and_remote_elements(link: Link) -> None:
    host_mem, dpu_mem = bytearray(4), bytearray(4)
    dst = chain(link.buf(link.dpu_mmap(dpu_mem), 0, 4), link.buf(link.host_mmap(host_mem), 0, 4))
    src = link.buf(link.dpu_mmap(bytearray(b"12345678")), 0, 8, 0, 8)
    event = link.run(src, dst)
    assert event.ok, event.error
    assert dpu_mem == b"1234"
    assert host_mem == b"5678"


def test_more_pieces_than_the_send_queue_holds(new_ip: Callable[[], str]) -> None:
    """Pieces wait for room in the connection's send queue; jobs complete, each once, all bytes right."""
    link = _open_link(new_ip, sq=2)
    try:
        host_mem = bytearray(64 * 12)
        remote = link.host_mmap(host_mem)
        src_mem = bytearray(bytes(range(256)) * 3)
        local = link.dpu_mmap(src_mem)
        jobs = []
        for j in range(4):  # 4 jobs of 3 pieces each (a 3-element destination list)
            src = link.buf(local, j * 192, 192, 0, 192)
            dst = chain(*(link.buf(remote, j * 192 + k * 64, 64) for k in range(3)))
            jobs.append(link.submit(src, dst, user_data=j))
        events = link.events(4)
        assert sorted(e.user_data for e in events) == [0, 1, 2, 3]  # type: ignore[type-var]
        assert all(e.ok and e.result == 192 for e in events)
        assert host_mem == src_mem
    finally:
        _close_link(link)


def test_polling_workq_runs_jobs_over_rdma(link: Link) -> None:
    """Without an event handle: progress_retrieve alone drives the connection."""
    link.dma.workq_rm(link.wq)  # DOCA 2.0 doca_ctx_stop: NOT_PERMITTED while a WorkQ is attached
    link.dma.stop()
    with WorkQ(4) as wq:
        link.dma.workq_add(wq)
        link.dma.start()
        host_mem = bytearray(4096)
        src = link.buf(link.dpu_mmap(bytearray(b"z" * 4096)), 0, 4096, 0, 4096)
        wq.submit(DmaMemcpyJob(ctx=link.dma, src=src, dst=link.buf(link.host_mmap(host_mem), 0, 4096)))
        for _ in range(MAX_ROUNDS):
            if (event := wq.progress_retrieve()) is not None:
                break
        else:
            raise AssertionError("never completed")
        assert event.ok
        assert host_mem == b"z" * 4096
        link.dma.workq_rm(wq)
        link.dma.stop()


# -- submit-time rules --------------------------------------------------------------------------


def test_room_and_overlap_rules_hold_for_remote_buffers(link: Link) -> None:
    remote = link.host_mmap(bytearray(16))
    src = link.buf(link.dpu_mmap(bytearray(16)), 0, 16, 0, 16)
    small = link.buf(remote, 0, 8)
    assert error_code(lambda: link.submit(src, small)) is DocaErrorCode.INVALID_VALUE
    a = link.buf(remote, 0, 16, 0, 8)
    b = link.buf(remote, 4, 12)
    assert error_code(lambda: link.submit(a, b)) is DocaErrorCode.INVALID_VALUE  # overlap, both remote


def test_remote_to_remote_is_not_supported(link: Link) -> None:
    remote = link.host_mmap(bytearray(32))
    src, dst = link.buf(remote, 0, 16, 0, 16), link.buf(remote, 16, 16)
    with pytest.raises(DocaError) as exc:
        link.submit(src, dst)
    assert exc.value.code is DocaErrorCode.NOT_SUPPORTED
    assert "both" in exc.value.message


def test_destination_in_flight_is_in_use(link: Link) -> None:
    src = link.buf(link.dpu_mmap(bytearray(8)), 0, 8, 0, 8)
    dst = link.buf(link.host_mmap(bytearray(16)), 0, 16)
    link.submit(src, dst)
    assert error_code(lambda: link.submit(src, dst)) is DocaErrorCode.IN_USE
    assert link.events(1)[0].ok


# -- errors -------------------------------------------------------------------------------------


def test_without_a_connection_remote_memory_is_not_supported(link: Link) -> None:
    dma = DmaOverRdma(link.dpu)
    with dma, WorkQ(4) as wq:
        dma.workq_add(wq)
        dma.start()
        remote = link.host_mmap(bytearray(8))
        for src, dst in (
            (link.buf(link.dpu_mmap(bytearray(8)), 0, 8, 0, 8), link.buf(remote, 0, 8)),
            (link.buf(remote, 0, 8, 0, 8), link.buf(link.dpu_mmap(bytearray(8)), 0, 8)),
        ):
            with pytest.raises(DocaError) as exc:
                wq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))
            assert exc.value.code is DocaErrorCode.NOT_SUPPORTED
            assert "DmaOverRdma.set_rdma" in exc.value.message
            assert dma.num_inflight == 0


def test_a_connection_not_yet_connected_is_bad_state(link: Link, new_ip: Callable[[], str]) -> None:
    rdma = Rdma()
    rdma.add_dev(link.dpu)
    dma = DmaOverRdma(link.dpu)
    with rdma, dma, WorkQ(4) as wq:
        dma.set_rdma(rdma)
        dma.workq_add(wq)
        dma.start()
        src = link.buf(link.dpu_mmap(bytearray(8)), 0, 8, 0, 8)
        dst = link.buf(link.host_mmap(bytearray(8)), 0, 8)
        assert (
            error_code(lambda: wq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))) is DocaErrorCode.BAD_STATE
        )
        rdma.start()  # STARTING, INIT: still not connected
        assert (
            error_code(lambda: wq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))) is DocaErrorCode.BAD_STATE
        )


def test_set_rdma_is_idle_only_and_checks_the_device(link: Link, new_ip: Callable[[], str]) -> None:
    assert link.dma.rdma is link.rdma
    assert error_code(lambda: link.dma.set_rdma(None)) is DocaErrorCode.BAD_STATE
    assert error_code(lambda: link.dma.set_rdma(object())) is DocaErrorCode.BAD_STATE  # type: ignore[arg-type]
    with DmaOverRdma(link.dpu) as dma:
        assert error_code(lambda: dma.set_rdma(object())) is DocaErrorCode.INVALID_VALUE  # type: ignore[arg-type]
        dma.set_rdma(link.host_rdma)  # on another device
        assert error_code(dma.start) is DocaErrorCode.INVALID_VALUE
        assert dma.state is CtxState.IDLE
        dma.set_rdma(None)
        dma.start()


def test_export_without_rdma_write_fails_the_job_with_the_cause(link: Link) -> None:
    """The exporter's device refuses the write (remote access error): IO_FAILED, NOT_PERMITTED."""
    host_mem = bytearray(8)
    remote = link.host_mmap(host_mem, AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ)
    src = link.buf(link.dpu_mmap(bytearray(b"denied!!")), 0, 8, 0, 8)
    dst = link.buf(remote, 0, 8)
    event = link.run(src, dst)
    assert event.status is DocaErrorCode.IO_FAILED
    assert event.error is not None
    assert event.error.code is DocaErrorCode.NOT_PERMITTED
    assert "RDMA_WRITE" in event.error.message
    assert event.error.message.startswith("DMA over RDMA")
    assert dst.data_len == 0
    assert host_mem == bytes(8)
    assert link.rdma.rdma_state is RdmaState.ERROR
    # Later jobs flush with the cause until the connection is recovered.
    src2 = link.buf(link.dpu_mmap(bytearray(b"x")), 0, 1, 0, 1)
    late = link.run(src2, link.buf(link.host_mmap(bytearray(1)), 0, 1))
    assert late.status is DocaErrorCode.IO_FAILED
    assert late.error is not None
    assert "RDMA_WRITE" in late.error.message


def test_export_without_rdma_read_fails_the_read(link: Link) -> None:
    remote = link.host_mmap(bytearray(b"secret"), AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE)
    dst_mem = bytearray(6)
    dst = link.buf(link.dpu_mmap(dst_mem), 0, 6)
    event = link.run(link.buf(remote, 0, 6, 0, 6), dst)
    assert event.status is DocaErrorCode.IO_FAILED
    assert event.error is not None
    assert event.error.code is DocaErrorCode.NOT_PERMITTED
    assert "RDMA_READ" in event.error.message
    assert dst.data_len == 0


def test_peer_context_without_the_permission_fails_the_job(new_ip: Callable[[], str]) -> None:
    link = _open_link(new_ip, host_perms=AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ)
    try:
        src = link.buf(link.dpu_mmap(bytearray(4)), 0, 4, 0, 4)
        event = link.run(src, link.buf(link.host_mmap(bytearray(4)), 0, 4))
        assert event.status is DocaErrorCode.IO_FAILED
        assert event.error is not None
        assert event.error.code is DocaErrorCode.INVALID_VALUE
        assert "RDMA_WRITE" in event.error.message
    finally:
        _close_link(link)


def test_local_destination_without_write_permission_fails_before_the_network(link: Link) -> None:
    """As local DMA: NOT_PERMITTED as the job's error, nothing posted, the connection unharmed."""
    src = link.buf(link.host_mmap(bytearray(b"abcd")), 0, 4, 0, 4)
    dst_mem = bytearray(4)
    dst = link.buf(link.dpu_mmap(dst_mem, AccessFlag.LOCAL_READ_ONLY), 0, 4)
    event = link.run(src, dst)
    assert event.status is DocaErrorCode.IO_FAILED
    assert event.error is not None
    assert event.error.code is DocaErrorCode.NOT_PERMITTED
    assert dst_mem == bytes(4)
    assert link.rdma.rdma_state is RdmaState.CONNECTED


def test_peer_gone_fails_the_job_after_the_retries(link: Link) -> None:
    """The exporter's device closed: requests go unanswered, retries run out (TIME_OUT, fault PEER)."""
    remote = link.host_mmap(bytearray(64))
    src = link.buf(link.dpu_mmap(bytearray(64)), 0, 64, 0, 64)
    dst = link.buf(remote, 0, 64)
    link.host_rdma.close()  # its QP is gone: nothing answers on it any more
    event = link.run(src, dst)
    assert event.status is DocaErrorCode.IO_FAILED
    assert event.error is not None
    assert event.error.code is DocaErrorCode.TIME_OUT
    assert "stopped answering" in event.error.message
    assert dst.data_len == 0


def test_closing_the_dma_context_with_pieces_in_flight(link: Link) -> None:
    """close flushes the job (SHUTDOWN); the pieces' buffers come back when the RDMA side finishes."""
    remote = link.host_mmap(bytearray(1 << 16))
    local = link.dpu_mmap(bytearray(1 << 16))
    src = link.buf(local, 0, 1 << 16, 0, 1 << 16)
    dst = link.buf(remote, 0, 1 << 16)
    link.submit(src, dst)
    assert link.wq.progress_retrieve() is None  # the piece is posted, not complete
    link.dma.close()
    assert local.num_bufs >= 1
    link.rdma.workq_add(link.wq)  # the RDMA side is progressed through a WorkQ of its own engine
    for _ in range(MAX_ROUNDS):
        link.wq.progress_retrieve()
        if local.num_bufs == 1 and remote.num_bufs == 1:
            break
    assert (local.num_bufs, remote.num_bufs) == (1, 1)  # only the caller's src and dst
