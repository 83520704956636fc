"""The progress engine (rdmakit.doca.pe; DOCA 2.5+ doca_pe.h)."""

import os
import select
import threading
from collections.abc import Iterator

import pytest

from rdmakit.doca import Dev, Dma, DocaErrorCode, ProgressEngine, WorkQ, local_devinfo, thread_engine
from tests.doca.util import error_code


class FakePump:
    """A pump with a descriptor the test makes readable, counting its runs."""

    def __init__(self, busy: bool = False) -> None:
        self.runs = 0
        self.busy = busy
        self.efd = os.eventfd(0, os.EFD_NONBLOCK)

    def progress(self) -> bool:
        self.runs += 1
        return self.busy

    def fileno(self) -> int | None:
        return self.efd


class FakeCtx:
    def __init__(self, inflight: int = 0, busy: bool = False) -> None:
        self.num_inflight = inflight
        self.busy = busy
        self.runs = 0

    def _progress(self) -> bool:
        self.runs += 1
        return self.busy

    def _pe_connected(self, pe: ProgressEngine) -> None:
        pass

    def _pe_disconnected(self, pe: ProgressEngine) -> None:
        pass


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@pytest.fixture
def pe() -> Iterator[ProgressEngine]:
    engine = ProgressEngine()
    yield engine
    engine.close_all()  # teardown: the fake contexts a test left connected


def test_progress_says_whether_anything_happened(pe: ProgressEngine) -> None:
    """doca_pe_progress: nothing connected, nothing happened; a busy pump or context is something."""
    assert pe.progress() is False
    idle, busy = FakePump(), FakePump(busy=True)
    pe.add_pump(idle)
    assert pe.progress() is False
    pe.add_pump(busy)
    assert pe.progress() is True
    pe.remove_pump(busy)
    ctx = FakeCtx(busy=True)
    pe.connect_ctx(ctx)
    assert pe.progress() is True
    assert (idle.runs, busy.runs, ctx.runs) == (3, 1, 1)


def test_a_pump_shared_by_devices_runs_once_until_the_last_leaves(pe: ProgressEngine) -> None:
    pump = FakePump()
    pe.add_pump(pump)
    pe.add_pump(pump)
    pe.progress()
    assert pump.runs == 1
    pe.remove_pump(pump)
    pe.progress()
    assert pump.runs == 2
    pe.remove_pump(pump)
    pe.progress()
    assert pump.runs == 2
    assert pe.pumps == ()


def test_notification_handle_follows_pumps_and_requests(pe: ProgressEngine) -> None:
    """doca_pe_get_notification_handle / request_notification / clear_notification."""
    pump = FakePump()
    pe.add_pump(pump)
    handle = pe.notification_handle
    assert not readable(handle)
    os.eventfd_write(pump.efd, 1)
    assert readable(handle)  # a pump's descriptor is readable: progress has work
    os.eventfd_read(pump.efd)
    assert not readable(handle)
    pe.notify()
    assert not readable(handle)  # not requested
    pe.request_notification()
    pe.notify()
    assert readable(handle)
    pe.clear_notification()
    assert not readable(handle)
    pe.remove_pump(pump)
    os.eventfd_write(pump.efd, 1)
    assert not readable(handle)  # a removed pump no longer wakes the engine
    os.close(pump.efd)


def test_contexts_are_connected_once_and_counted(pe: ProgressEngine) -> None:
    """doca_pe_connect_ctx ("DOCA_ERROR_NOT_PERMITTED - context is already connected to a progress
    engine") and doca_pe_get_num_inflight_tasks."""
    a, b = FakeCtx(inflight=2), FakeCtx(inflight=3)
    pe.connect_ctx(a)
    pe.connect_ctx(b)
    assert error_code(lambda: pe.connect_ctx(a)) is DocaErrorCode.NOT_PERMITTED
    assert pe.num_inflight_tasks == 5
    pe.disconnect_ctx(a)
    pe.disconnect_ctx(a)
    assert pe.ctxs == (b,)
    pe.progress()
    assert (a.runs, b.runs) == (0, 1)


def test_destroyed_engine_refuses_work() -> None:
    pe = ProgressEngine()
    pe.close()
    pe.close()
    assert pe.closed
    assert error_code(lambda: pe.connect_ctx(FakeCtx())) is DocaErrorCode.BAD_STATE
    assert error_code(pe.fileno) is DocaErrorCode.BAD_STATE


def test_workq_and_device_use_the_threads_engine_unless_given_one() -> None:
    with WorkQ(4) as wq, Dev.open(local_devinfo()) as dev:
        assert wq.pe is thread_engine() is dev.pe
        assert dev.pump in dev.pe.pumps
    other: list[ProgressEngine] = []
    t = threading.Thread(target=lambda: other.append(thread_engine()))
    t.start()
    t.join()
    assert other[0] is not thread_engine()


def test_closing_a_device_takes_its_pump_off_the_engine(pe: ProgressEngine) -> None:
    dev = Dev.open(local_devinfo(), pe=pe)
    pump = dev.pump
    assert pump in pe.pumps
    dev.close()
    assert pump not in pe.pumps


def test_a_context_on_another_engine_makes_that_engine_pump_the_device(pe: ProgressEngine) -> None:
    """A device shared by several engines (one device, a PE per thread): each engine a context of the
    device is connected to runs its pump, until the last such context leaves."""
    with Dev.open(local_devinfo(), pe=pe) as dev, Dma(dev) as dma, WorkQ(4) as elsewhere:
        pump = dev.pump
        assert pump not in elsewhere.pe.pumps
        dma.workq_add(elsewhere)
        assert pump in elsewhere.pe.pumps
        assert dma in elsewhere.pe.ctxs
        dma.workq_rm(elsewhere)
        assert pump not in elsewhere.pe.pumps
        assert pump in pe.pumps
        with WorkQ(4, pe=pe) as wq:
            dma.workq_add(wq)
            assert dma in pe.ctxs
            dma.workq_rm(wq)
            assert dma not in pe.ctxs
            assert pump in pe.pumps
