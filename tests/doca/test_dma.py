"""DOCA DMA: the memcpy job and its buffer rules (doca_dma.h, DOCA Core buffer rules)."""

import random
import select
from collections.abc import Iterator, Sequence
from ipaddress import IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmakit.doca import (
    LOCAL_CAPS,
    AccessFlag,
    BackendCaps,
    BackendCm,
    BackendDevice,
    BackendQP,
    BackendSRQ,
    Buf,
    BufInventory,
    CtxState,
    Dev,
    DeviceCaps,
    DevInfo,
    Dma,
    DmaMemcpyJob,
    DocaError,
    DocaErrorCode,
    Event,
    Fault,
    JobType,
    LocalBackendDevice,
    Mmap,
    SyncEventGetJob,
    WorkQ,
    local_devinfo,
)
from rdmakit.engine import Access, MemoryRegion, QpCaps
from tests.doca.util import MmapFactory, all_closed, error_code


@pytest.fixture
def inv() -> BufInventory:
    inventory = BufInventory(64)
    inventory.start()
    return inventory


@pytest.fixture
def dma(dev: Dev) -> Iterator[Dma]:
    with Dma(dev) as ctx, WorkQ(16) as workq:
        ctx.workq_add(workq)
        ctx.start()
        yield ctx


def run(dma: Dma, src: Buf, dst: Buf) -> Event:
    """Submit one job and progress until its event (which never comes from submit itself)."""
    workq = dma.workq
    assert workq is not None
    workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))
    assert dma.num_inflight == 1
    for _ in range(10):
        event = workq.progress_retrieve()
        if event is not None:
            return event
    raise AssertionError("the job never completed")


def buf_over(inv: BufInventory, mmap: Mmap, offset: int, length: int, data_off: int, data_len: int) -> Buf:
    return inv.get_by_args(mmap, mmap.addr + offset, length, mmap.addr + offset + data_off, data_len)


def chain(*bufs: Buf) -> Buf:
    for buf in bufs[1:]:
        bufs[0].chain_list(buf)
    return bufs[0]


def list_data(head: Buf) -> bytes:
    return b"".join(bytes(buf.source_view()) for buf in head)


# -- the basic rule: source data section -> destination tail ---------------------------------


def test_copies_the_source_data_section_to_the_destination_tail(
    dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    """doca_dma_task_memcpy: data section of src; appended to dst; dst data_len grows; src unchanged."""
    src_mem = bytearray(b"HEAD" + b"payload!" + b"TAIL")
    dst_mem = bytearray(b"old:" + bytes(20))
    src = buf_over(inv, make_mmap(src_mem), 0, 16, 4, 8)  # headroom 4, data 8, tailroom 4
    dst = buf_over(inv, make_mmap(dst_mem), 0, 24, 0, 4)  # data "old:", tailroom 20
    event = run(dma, src, dst)
    assert event.ok
    assert event.result == 8
    assert event.error is None
    assert dst_mem == bytearray(b"old:payload!" + bytes(12))
    assert (dst.data, dst.data_len) == (dst.addr, 12)
    assert src_mem == bytearray(b"HEADpayload!TAIL")
    assert src.data_len == 8


def test_event_comes_from_progress_not_from_submit(
    dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    """A job is asynchronous: after submit it is in flight and nothing is copied yet."""
    dst_mem = bytearray(4)
    src = buf_over(inv, make_mmap(bytearray(b"abcd")), 0, 4, 0, 4)
    dst = buf_over(inv, make_mmap(dst_mem), 0, 4, 0, 0)
    assert dma.workq is not None
    dma.workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst, user_data="tag"))
    assert dma.num_inflight == 1
    assert dst_mem == bytearray(4)
    assert dst.data_len == 0
    event = dma.workq.progress_retrieve()
    assert event is not None
    assert event.user_data == "tag"
    assert dst_mem == b"abcd"
    assert dma.workq.progress_retrieve() is None


def test_empty_source_copies_nothing(dma: Dma, make_mmap: MmapFactory, inv: BufInventory) -> None:
    src = buf_over(inv, make_mmap(8), 0, 8, 0, 0)
    dst = buf_over(inv, make_mmap(8), 0, 8, 0, 0)
    event = run(dma, src, dst)
    assert event.ok
    assert event.result == 0
    assert dst.data_len == 0


def test_gather_concatenates_the_data_of_every_source_element(
    dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    """A source list is gathered in order; each element contributes only its data section."""
    mem = bytearray(b"xxAAyy" + b"BBBB" + b"zCz")
    mmap = make_mmap(mem)
    src = chain(
        buf_over(inv, mmap, 0, 6, 2, 2), buf_over(inv, mmap, 6, 4, 0, 4), buf_over(inv, mmap, 10, 3, 1, 1)
    )
    dst_mem = bytearray(10)
    dst = buf_over(inv, make_mmap(dst_mem), 0, 10, 0, 0)
    assert run(dma, src, dst).result == 7
    assert dst_mem[:7] == b"AABBBBC"
    assert dst.data_len == 7


def test_scatter_fills_tailrooms_from_the_last_element_holding_data(
    dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    """The copy is appended to the list's data: earlier tailroom is skipped, later elements fill up."""
    dst_mem = bytearray(b"a...") + bytearray(b"bb..") + bytearray(4) + bytearray(4)
    mmap = make_mmap(dst_mem)
    first = buf_over(inv, mmap, 0, 4, 0, 1)  # data "a", tailroom 3: before the last data, skipped
    second = buf_over(inv, mmap, 4, 4, 0, 2)  # data "bb", tailroom 2: the copy starts here
    third = buf_over(inv, mmap, 8, 4, 0, 0)
    fourth = buf_over(inv, mmap, 12, 4, 0, 0)
    dst = chain(first, second, third, fourth)
    src = buf_over(inv, make_mmap(bytearray(b"1234567")), 0, 7, 0, 7)
    assert run(dma, src, dst).result == 7
    assert [b.data_len for b in dst] == [1, 4, 4, 1]
    assert list_data(dst) == b"a" + b"bb" + b"1234567"
    assert dst_mem[:4] == b"a..."  # the skipped tailroom is untouched


def test_destination_too_small_is_rejected_at_submit(
    dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    src = buf_over(inv, make_mmap(bytearray(b"12345")), 0, 5, 0, 5)
    dst = buf_over(inv, make_mmap(8), 0, 8, 0, 4)  # tailroom 4
    workq = dma.workq
    assert workq is not None
    assert (
        error_code(lambda: workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst)))
        is DocaErrorCode.INVALID_VALUE
    )
    assert dma.num_inflight == 0
    assert workq.inflight == 0


def test_overlapping_source_and_destination_are_rejected(
    dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    mmap = make_mmap(16)
    src = buf_over(inv, mmap, 0, 8, 0, 8)
    dst = buf_over(inv, mmap, 4, 12, 0, 0)
    assert dma.workq is not None
    with pytest.raises(DocaError) as exc:
        dma.workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))
    assert exc.value.code is DocaErrorCode.INVALID_VALUE
    assert exc.value.fault is Fault.CALLER


def test_source_and_destination_must_be_list_heads(
    dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    mmap = make_mmap(16)
    head = chain(buf_over(inv, mmap, 0, 4, 0, 4), buf_over(inv, mmap, 4, 4, 0, 4))
    second = head.get_next()
    assert second is not None
    dst = buf_over(inv, make_mmap(16), 0, 16, 0, 0)
    assert dma.workq is not None
    workq = dma.workq
    assert (
        error_code(lambda: workq.submit(DmaMemcpyJob(ctx=dma, src=second, dst=dst)))
        is DocaErrorCode.INVALID_VALUE
    )
    assert (
        error_code(lambda: workq.submit(DmaMemcpyJob(ctx=dma, src=dst, dst=second)))
        is DocaErrorCode.INVALID_VALUE
    )


def test_a_destination_is_in_one_job_at_a_time(dma: Dma, make_mmap: MmapFactory, inv: BufInventory) -> None:
    src = buf_over(inv, make_mmap(bytearray(b"ab")), 0, 2, 0, 2)
    dst = buf_over(inv, make_mmap(8), 0, 8, 0, 0)
    assert dma.workq is not None
    workq = dma.workq
    workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))
    assert error_code(lambda: workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))) is DocaErrorCode.IN_USE
    assert workq.progress_retrieve() is not None
    workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))  # free again once its event is out
    assert workq.progress_retrieve() is not None
    assert list_data(dst) == b"abab"


def test_only_dma_jobs(dma: Dma) -> None:
    assert dma.workq is not None
    workq = dma.workq
    assert error_code(lambda: workq.submit(SyncEventGetJob(ctx=dma))) is DocaErrorCode.NOT_SUPPORTED


# -- protection: memory is reached through the device ------------------------------------------


def test_read_only_destination_fails_the_job_and_copies_nothing(
    dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    """A write into memory mapped without LOCAL_READ_WRITE is a protection error in the event."""
    dst_mem = bytearray(8)
    src = buf_over(inv, make_mmap(bytearray(b"data")), 0, 4, 0, 4)
    dst = buf_over(inv, make_mmap(dst_mem, AccessFlag.LOCAL_READ_ONLY), 0, 8, 0, 0)
    event = run(dma, src, dst)
    assert event.status is DocaErrorCode.IO_FAILED
    assert not event.ok
    assert event.error is not None
    assert event.error.code is DocaErrorCode.NOT_PERMITTED
    assert dst_mem == bytearray(8)
    assert dst.data_len == 0


def test_memory_not_registered_on_the_contexts_device_fails_the_job(
    dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    with Dev.open(local_devinfo("other")) as other:
        mmap = Mmap()
        mmap.set_memrange(bytearray(b"elsewhere"))
        mmap.add_dev(other)
        mmap.start()
        src = buf_over(inv, mmap, 0, 9, 0, 9)
        dst_mem = bytearray(9)
        dst = buf_over(inv, make_mmap(dst_mem), 0, 9, 0, 0)
        event = run(dma, src, dst)
        assert event.error is not None
        assert event.error.code is DocaErrorCode.NOT_PERMITTED
        assert dst_mem == bytearray(9)
        src.dec_refcount()
        mmap.destroy()


def test_memory_on_another_machine_is_not_supported(
    dev: Dev, dma: Dma, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    """DOCA DMA never crosses the network: memory on another machine (export_rdma) is NOT_SUPPORTED."""
    exported = make_mmap(64, AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ)
    remote = Mmap.create_from_export(exported.export_rdma(dev), dev)
    src = buf_over(inv, remote, 0, 64, 0, 64)
    dst = buf_over(inv, make_mmap(64), 0, 64, 0, 0)
    assert dma.workq is not None
    workq = dma.workq
    assert (
        error_code(lambda: workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst)))
        is DocaErrorCode.NOT_SUPPORTED
    )
    src.dec_refcount()
    remote.destroy()


# -- limits and capabilities ----------------------------------------------------------------------


def _capped_devinfo(caps: BackendCaps) -> DevInfo:
    return DevInfo(
        name="capped",
        kind="local",
        opener=lambda: LocalBackendDevice("capped", rng=random.Random(7), caps=caps),
        caps=caps,
    )


def test_capabilities_are_the_devices() -> None:
    """doca_dma_cap_task_memcpy_*: support, max buffer size and list length from the device."""
    caps = DeviceCaps(max_buf_size=1000, max_buf_list_len=3, job_types=frozenset({JobType.DMA_MEMCPY}))
    info = _capped_devinfo(caps)
    assert Dma.cap_is_supported(info)
    assert (Dma.cap_max_buf_size(info), Dma.cap_max_buf_list_len(info)) == (1000, 3)
    assert Dma.cap_is_supported(local_devinfo())
    assert Dma.cap_max_buf_size(local_devinfo()) == LOCAL_CAPS.max_buf_size
    with Dev.open(info) as dev, Dma(dev) as dma:
        assert (dma.max_buf_size, dma.max_buf_list_len) == (1000, 3)


def test_limits_are_enforced_at_submit(inv: BufInventory) -> None:
    caps = DeviceCaps(max_buf_size=10, max_buf_list_len=2, job_types=frozenset({JobType.DMA_MEMCPY}))
    with Dev.open(_capped_devinfo(caps)) as dev, Dma(dev) as dma, WorkQ(4) as workq:
        dma.workq_add(workq)
        dma.start()
        mmaps = []
        for size in (64, 64):
            mmap = Mmap()
            mmap.set_memrange(bytearray(size))
            mmap.add_dev(dev)
            mmap.start()
            mmaps.append(mmap)
        dst = buf_over(inv, mmaps[1], 0, 64, 0, 0)
        too_long = chain(*(buf_over(inv, mmaps[0], i, 1, 0, 1) for i in range(3)))
        assert (
            error_code(lambda: workq.submit(DmaMemcpyJob(ctx=dma, src=too_long, dst=dst)))
            is DocaErrorCode.TOO_BIG
        )
        too_big = buf_over(inv, mmaps[0], 10, 11, 0, 11)
        assert (
            error_code(lambda: workq.submit(DmaMemcpyJob(ctx=dma, src=too_big, dst=dst)))
            is DocaErrorCode.TOO_BIG
        )
        just_right = buf_over(inv, mmaps[0], 30, 10, 0, 10)
        workq.submit(DmaMemcpyJob(ctx=dma, src=just_right, dst=dst))
        assert workq.progress_retrieve() is not None
        for buf in (dst, too_long, too_big, just_right):
            buf.dec_refcount()
        for mmap in mmaps:
            mmap.destroy()


def test_device_rules() -> None:
    """One device per DMA context, and it must run memcpy jobs; start needs it."""
    no_dma = DeviceCaps(job_types=frozenset({JobType.RDMA_SEND}))
    with Dev.open(_capped_devinfo(no_dma)) as plain, Dev.open(local_devinfo("a")) as a:
        assert error_code(lambda: Dma(plain)) is DocaErrorCode.NOT_SUPPORTED
        with Dma() as dma:
            assert error_code(dma.start) is DocaErrorCode.BAD_STATE
            dma.add_dev(a)
            assert error_code(lambda: dma.add_dev(plain)) is DocaErrorCode.IN_USE
            dma.start()
            assert dma.state is CtxState.RUNNING
            assert dma.dev is a


def test_stop_waits_for_jobs_and_workq_rm(dma: Dma, make_mmap: MmapFactory, inv: BufInventory) -> None:
    """DOCA 2.0 ``doca_ctx.h``, doca_ctx_stop: "DOCA_ERROR_NOT_PERMITTED - either some jobs are still
    pending or not all WorkQs have been removed"."""
    dst_mem = bytearray(2)
    src = buf_over(inv, make_mmap(bytearray(b"ok")), 0, 2, 0, 2)
    dst = buf_over(inv, make_mmap(dst_mem), 0, 2, 0, 0)
    workq = dma.workq
    assert workq is not None
    workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))
    assert error_code(dma.stop) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: dma.workq_rm(workq)) is DocaErrorCode.NOT_PERMITTED
    event = workq.progress_retrieve()
    assert event is not None
    assert event.ok
    assert dst_mem == b"ok"
    dma.workq_rm(workq)
    assert dma.stop() is DocaErrorCode.SUCCESS
    assert dma.state is CtxState.IDLE


def test_close_flushes_in_flight_jobs(dev: Dev, make_mmap: MmapFactory, inv: BufInventory) -> None:
    with WorkQ(4) as workq:
        dma = Dma(dev)
        dma.workq_add(workq)
        dma.start()
        dst_mem = bytearray(2)
        src = buf_over(inv, make_mmap(bytearray(b"no")), 0, 2, 0, 2)
        dst = buf_over(inv, make_mmap(dst_mem), 0, 2, 0, 0)
        workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))
        dma.close()
        assert dst_mem == bytearray(2)
        assert workq.progress_retrieve() is not None  # the flushed job's event (SHUTDOWN)
        assert workq.progress_retrieve() is None


def test_event_driven_handle_fires_for_a_submitted_job(
    dev: Dev, make_mmap: MmapFactory, inv: BufInventory
) -> None:
    """The WorkQ's event handle becomes readable when the DMA context has work."""
    with WorkQ(4, event_driven=True) as workq, Dma(dev) as dma:
        dma.workq_add(workq)
        dma.start()
        workq.arm()
        assert select.select([workq], [], [], 0)[0] == []
        src = buf_over(inv, make_mmap(bytearray(b"evt")), 0, 3, 0, 3)
        dst = buf_over(inv, make_mmap(3), 0, 3, 0, 0)
        workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))
        assert select.select([workq], [], [], 5)[0] == [workq]
        workq.clear()
        event = workq.progress_retrieve()
        assert event is not None
        assert event.ok


# -- a backend without resolve: memory reached through BackendDevice.local_view only --------------


class _NoResolve:
    """A local device that, like the soft backend, registers in an engine PD but has no `resolve`."""

    def __init__(self) -> None:
        self._inner = LocalBackendDevice("noresolve", rng=random.Random(3))
        self.name, self.kind, self.caps = "noresolve", "local", LOCAL_CAPS
        self.gids: Sequence[IPv6Address] = self._inner.gids
        self.gid, self.gid_index, self.gid_at = self._inner.gid, 0, self._inner.gid_at
        self.pump = self._inner.pump
        self.mtu = 4096

    def local_view(self, lkey: int, addr: int, length: int, *, write: bool) -> memoryview | None:
        for mr in self._inner._pd:  # the registration's own bytes, as the soft backend does
            if (
                mr.lkey == lkey
                and mr.contains(addr, length)
                and not (write and not mr.access & Access.LOCAL_WRITE)
            ):
                return mr.view[addr - mr.addr : addr - mr.addr + length]
        return None

    def register_memory(self, buffer: memoryview, addr: int, access: Access) -> MemoryRegion:
        return self._inner.register_memory(buffer, addr, access)

    def deregister(self, registration: object) -> None:
        self._inner.deregister(registration)  # type: ignore[arg-type]

    def create_qp(
        self, caps: QpCaps, gid_index: int | None = None, srq: BackendSRQ | None = None
    ) -> BackendQP:
        return self._inner.create_qp(caps)

    def create_srq(self, max_wr: int, max_sge: int) -> BackendSRQ:
        return self._inner.create_srq(max_wr, max_sge)

    def cm(self) -> BackendCm:
        return self._inner.cm()

    def close(self) -> None:
        self._inner.close()


def test_backend_without_resolve_copies_through_its_registrations(inv: BufInventory) -> None:
    info = DevInfo(name="noresolve", kind="local", opener=_NoResolve, caps=LOCAL_CAPS)
    with all_closed(Dev.open(info)) as dev, Dma(dev) as dma, WorkQ(4) as workq:
        assert not hasattr(dev.backend, "resolve")
        assert isinstance(dev.backend, BackendDevice)
        dma.workq_add(workq)
        dma.start()
        mmaps = []
        for memory, access in (
            (bytearray(b"via the PD"), AccessFlag.LOCAL_READ_ONLY),
            (bytearray(10), AccessFlag.LOCAL_READ_WRITE),
        ):
            mmap = Mmap()
            mmap.set_permissions(access)
            mmap.set_memrange(memory)
            mmap.add_dev(dev)
            mmap.start()
            mmaps.append((mmap, memory))
        (src_mmap, _), (dst_mmap, dst_mem) = mmaps
        src = buf_over(inv, src_mmap, 0, 10, 0, 10)
        dst = buf_over(inv, dst_mmap, 0, 10, 0, 0)
        event = run(dma, src, dst)
        assert event.ok
        assert dst_mem == b"via the PD"
        back = run(dma, dst, buf_over(inv, src_mmap, 0, 10, 0, 0))  # into read-only memory
        assert back.error is not None
        assert back.error.code is DocaErrorCode.NOT_PERMITTED


# -- the rules as a model -------------------------------------------------------------------------

_lens = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(src_layout=_lens, dst_layout=_lens, seed=st.integers(0, 2**32 - 1))
def test_any_lists_follow_the_model(
    src_layout: list[tuple[int, int, int]], dst_layout: list[tuple[int, int, int]], seed: int
) -> None:
    """For any source and destination lists: the destination list's data becomes old data + source data,
    or the job is refused at submit (INVALID_VALUE) when the room after the last data is too small."""
    rng = random.Random(seed)
    with Dev.open(local_devinfo("model", rng=rng)) as dev, Dma(dev) as dma, WorkQ(4) as workq:
        dma.workq_add(workq)
        dma.start()
        inventory = BufInventory(16)
        inventory.start()

        def build(layout: list[tuple[int, int, int]]) -> tuple[Mmap, Buf]:
            total = sum(h + d + t for h, d, t in layout) or 1
            mmap = Mmap()
            mmap.set_memrange(bytearray(rng.randbytes(total)))
            mmap.add_dev(dev)
            mmap.start()
            bufs, offset = [], 0
            for head, data, tail in layout:
                bufs.append(buf_over(inventory, mmap, offset, head + data + tail, head, data))
                offset += head + data + tail
            return mmap, chain(*bufs)

        src_mmap, src = build(src_layout)
        dst_mmap, dst = build(dst_layout)
        expected_src = list_data(src)
        old = list_data(dst)
        last = max((i for i, (_, d, _) in enumerate(dst_layout) if d), default=0)
        room = sum(t for _, _, t in dst_layout[last:])
        if room < len(expected_src):
            assert (
                error_code(lambda: workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst)))
                is DocaErrorCode.INVALID_VALUE
            )
            assert list_data(dst) == old
        else:
            workq.submit(DmaMemcpyJob(ctx=dma, src=src, dst=dst))
            event = workq.progress_retrieve()
            assert event is not None
            assert event.ok
            assert event.result == len(expected_src)
            assert list_data(dst) == old + expected_src
            assert list_data(src) == expected_src
        src.dec_refcount()
        dst.dec_refcount()
        src_mmap.destroy()
        dst_mmap.destroy()
