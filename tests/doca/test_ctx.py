"""DOCA Core 3.4: the context lifecycle and the work queue (doca_ctx.h)."""

import select
import selectors
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from rdmakit.doca import (
    Ctx,
    CtxState,
    Dev,
    DocaError,
    DocaErrorCode,
    Event,
    Job,
    SyncEvent,
    SyncEventWaitGtJob,
    WorkQ,
)
from tests.doca.util import error_code


@dataclass(frozen=True, slots=True, kw_only=True)
class TickJob(Job):
    ticks: int = 0  # progress calls until the job completes
    fail: bool = False


class TickCtx(Ctx[TickJob]):
    """A minimal real context: a job completes after `ticks` progress calls."""

    def __init__(self, *, connect_async: bool = False) -> None:
        super().__init__()
        self.connect_async = connect_async
        self.option = 0
        self.running: list[list[Any]] = []

    def set_option(self, value: int) -> None:
        self._require_idle("set_option")
        self.option = value

    def _start(self) -> bool:
        return not self.connect_async

    def _submit(self, job: TickJob) -> None:
        if job.ticks < 0:
            raise DocaError(DocaErrorCode.INVALID_VALUE, "negative ticks")
        if job.ticks == 0:
            self._finish(job)
        else:
            self.running.append([job, job.ticks])

    def _finish(self, job: TickJob) -> None:
        error = DocaError(DocaErrorCode.NOT_PERMITTED, "remote access error") if job.fail else None
        self._complete(job, result=job.ticks, error=error)

    def _progress(self) -> bool:
        for entry in self.running:
            entry[1] -= 1
        done = [entry for entry in self.running if entry[1] == 0]
        for entry in done:
            self.running.remove(entry)
            self._finish(entry[0])
        return bool(done)

    def _cancel(self) -> None:
        self.running.clear()


@pytest.fixture
def ctx(workq: WorkQ) -> Iterator[TickCtx]:
    with TickCtx() as c:
        c.workq_add(workq)
        c.start()
        yield c


def _drain(workq: WorkQ, limit: int = 100) -> list[Event]:
    events = []
    for _ in range(limit):
        event = workq.progress_retrieve()
        if event is not None:
            events.append(event)
    return events


# -- lifecycle -----------------------------------------------------------------------


def test_state_values_match_doca_ctx_h() -> None:
    """DOCA Core 3.4: enum doca_ctx_states has the values of doca_ctx.h."""
    assert [(s.name, s.value) for s in CtxState] == [
        ("IDLE", 0),
        ("STARTING", 1),
        ("RUNNING", 2),
        ("STOPPING", 3),
    ]


def test_sync_start_and_stop_call_back_each_transition() -> None:
    """DOCA Core 3.4 (doca_ctx_set_state_changed_cb): IDLE -> RUNNING -> STOPPING -> IDLE, each reported."""
    seen: list[tuple[CtxState, CtxState, CtxState]] = []
    ctx = TickCtx()
    ctx.set_state_changed_cb(lambda _ud, c, prev, nxt: seen.append((prev, nxt, c.state)))
    ctx.start()
    ctx.stop()
    assert seen == [
        (CtxState.IDLE, CtxState.RUNNING, CtxState.RUNNING),
        (CtxState.RUNNING, CtxState.STOPPING, CtxState.STOPPING),
        (CtxState.STOPPING, CtxState.IDLE, CtxState.IDLE),
    ]


def test_async_start_goes_through_starting(workq: WorkQ) -> None:
    """DOCA Core 3.4: an asynchronous start is STARTING until connected; no jobs meanwhile."""
    ctx = TickCtx(connect_async=True)
    ctx.workq_add(workq)
    ctx.start()
    assert ctx.state is CtxState.STARTING
    assert error_code(lambda: workq.submit(TickJob(ctx=ctx))) is DocaErrorCode.BAD_STATE
    ctx._connected()
    assert ctx.state is CtxState.RUNNING  # type: ignore[comparison-overlap]  # _connected() changed it
    workq.submit(TickJob(ctx=ctx))


def test_transitions_not_in_the_table_are_bad_state() -> None:
    """DOCA Core 3.4: start twice, stop when idle, connect when running: BAD_STATE, state unchanged."""
    ctx = TickCtx()
    assert error_code(ctx.stop) is DocaErrorCode.BAD_STATE
    ctx.start()
    assert error_code(ctx.start) is DocaErrorCode.BAD_STATE
    assert error_code(ctx._connected) is DocaErrorCode.BAD_STATE
    assert ctx.state is CtxState.RUNNING


def test_configuration_only_when_idle(dev: Dev) -> None:
    """DOCA Core 3.4 (doca_ctx_start): a started context can't be configured; stop to reconfigure."""
    ctx = TickCtx()
    ctx.add_dev(dev)
    ctx.set_option(1)
    ctx.start()
    assert error_code(lambda: ctx.set_option(2)) is DocaErrorCode.BAD_STATE
    assert error_code(lambda: ctx.rm_dev(dev)) is DocaErrorCode.BAD_STATE
    ctx.stop()
    ctx.set_option(2)
    ctx.rm_dev(dev)
    assert (ctx.option, ctx.devs) == (2, ())


def test_device_added_twice_or_missing(dev: Dev) -> None:
    """DOCA Core 3.4 (doca_ctx_dev_add/rm): IN_USE and NOT_FOUND."""
    ctx = TickCtx()
    ctx.add_dev(dev)
    assert error_code(lambda: ctx.add_dev(dev)) is DocaErrorCode.IN_USE
    ctx.rm_dev(dev)
    assert error_code(lambda: ctx.rm_dev(dev)) is DocaErrorCode.NOT_FOUND


def test_stop_needs_the_workq_removed_and_the_jobs_done(workq: WorkQ, ctx: TickCtx) -> None:
    """DOCA 2.0 ``doca_ctx.h``, doca_ctx_stop: "DOCA_ERROR_NOT_PERMITTED - either some jobs are
    still pending or not all WorkQs have been removed"; doca_ctx_workq_rm: "DOCA_ERROR_NOT_PERMITTED
    - some jobs are still pending completion"."""
    workq.submit(TickJob(ctx=ctx, ticks=2))
    with pytest.raises(DocaError) as exc:
        ctx.stop()
    assert exc.value.code is DocaErrorCode.NOT_PERMITTED
    assert "workq_rm" in str(exc.value)
    assert ctx.state is CtxState.RUNNING
    assert error_code(lambda: ctx.workq_rm(workq)) is DocaErrorCode.NOT_PERMITTED
    assert workq.progress_retrieve() is None
    event = workq.progress_retrieve()
    assert event is not None
    assert event.ok
    assert event.result == 2
    ctx.workq_rm(workq)
    assert ctx.stop() is DocaErrorCode.SUCCESS
    assert ctx.state is CtxState.IDLE  # type: ignore[comparison-overlap]  # stop changed it


def test_close_flushes_in_flight_jobs(workq: WorkQ) -> None:
    """Style rule 7: closing a context fails its in-flight jobs with SHUTDOWN; close is idempotent."""
    ctx = TickCtx()
    ctx.workq_add(workq)
    ctx.start()
    job = TickJob(ctx=ctx, ticks=10)
    workq.submit(job)
    ctx.close()
    ctx.close()
    assert ctx.closed
    assert ctx.workq is None
    assert ctx.state is CtxState.IDLE
    event = workq.progress_retrieve()
    assert event is not None
    assert event.job is job
    assert event.status is DocaErrorCode.IO_FAILED
    assert event.error is not None
    assert event.error.code is DocaErrorCode.SHUTDOWN
    assert error_code(ctx.start) is DocaErrorCode.BAD_STATE


# -- work queue ----------------------------------------------------------------------


def test_progress_retrieve_returns_none_for_again(workq: WorkQ, ctx: TickCtx) -> None:
    """DOCA Core 3.4 (doca_workq_progress_retrieve): no event yet is AGAIN, returned as None."""
    assert workq.progress_retrieve() is None
    job = TickJob(ctx=ctx, ticks=3, user_data="mine")
    workq.submit(job)
    assert workq.progress_retrieve() is None
    assert workq.progress_retrieve() is None
    event = workq.progress_retrieve()
    assert event == Event(job=job, status=DocaErrorCode.SUCCESS, result=3)
    assert event.user_data == "mine"
    assert workq.progress_retrieve() is None


def test_failed_job_is_an_event_not_an_exception(workq: WorkQ, ctx: TickCtx) -> None:
    """DOCA Core 3.4 (doca_workq_progress_retrieve): a failed job comes back with status IO_FAILED."""
    workq.submit(TickJob(ctx=ctx, ticks=1, fail=True))
    (event,) = _drain(workq)
    assert event.status is DocaErrorCode.IO_FAILED
    assert not event.ok
    assert event.error is not None
    assert event.error.code is DocaErrorCode.NOT_PERMITTED


def test_submit_rejected_by_the_context_is_raised(workq: WorkQ, ctx: TickCtx) -> None:
    """A job the context refuses at submission raises, and takes no WorkQ slot."""
    assert error_code(lambda: workq.submit(TickJob(ctx=ctx, ticks=-1))) is DocaErrorCode.INVALID_VALUE
    assert workq.inflight == 0
    assert ctx.num_inflight == 0


def test_depth_bounds_jobs_in_flight(workq: WorkQ, ctx: TickCtx) -> None:
    """DOCA Core 3.4 (doca_workq_submit): beyond `depth` jobs in flight is NO_MEMORY."""
    jobs = [TickJob(ctx=ctx, ticks=1) for _ in range(workq.depth)]
    for job in jobs:
        workq.submit(job)
    assert error_code(lambda: workq.submit(TickJob(ctx=ctx))) is DocaErrorCode.NO_MEMORY
    assert workq.progress_retrieve() is not None  # retrieving an event frees its slot
    workq.submit(TickJob(ctx=ctx, ticks=1))
    assert len(_drain(workq)) == workq.depth


def test_completed_but_unretrieved_jobs_hold_their_slot(workq: WorkQ, ctx: TickCtx) -> None:
    """A job's slot is free only once its event is retrieved."""
    for _ in range(workq.depth):
        workq.submit(TickJob(ctx=ctx))  # completes at once
    assert ctx.num_inflight == 0
    assert error_code(lambda: workq.submit(TickJob(ctx=ctx))) is DocaErrorCode.NO_MEMORY


def test_job_object_in_flight_once(workq: WorkQ, ctx: TickCtx) -> None:
    """DOCA Core 3.4: a job in flight cannot be submitted again (IN_USE); after its event, it can."""
    job = TickJob(ctx=ctx, ticks=1)
    workq.submit(job)
    assert error_code(lambda: workq.submit(job)) is DocaErrorCode.IN_USE
    assert len(_drain(workq)) == 1
    workq.submit(job)


def test_submit_needs_the_context_attached(workq: WorkQ) -> None:
    """DOCA Core 3.4 (doca_workq_submit): a context not attached to this WorkQ is NOT_FOUND."""
    ctx = TickCtx()
    ctx.start()
    assert error_code(lambda: workq.submit(TickJob(ctx=ctx))) is DocaErrorCode.NOT_FOUND


def test_one_workq_per_context(workq: WorkQ, ctx: TickCtx) -> None:
    """DOCA Core 3.4 (doca_ctx_workq_add): attaching again is IN_USE."""
    with WorkQ(1) as other:
        assert error_code(lambda: ctx.workq_add(other)) is DocaErrorCode.IN_USE
        assert error_code(lambda: ctx.workq_rm(other)) is DocaErrorCode.NOT_FOUND
    assert error_code(lambda: ctx.workq_add(workq)) is DocaErrorCode.IN_USE


def test_workq_rm_waits_for_jobs(workq: WorkQ, ctx: TickCtx) -> None:
    """DOCA Core 3.4 (doca_ctx_workq_rm): NOT_PERMITTED while jobs are pending."""
    workq.submit(TickJob(ctx=ctx, ticks=1))
    assert error_code(lambda: ctx.workq_rm(workq)) is DocaErrorCode.NOT_PERMITTED
    _drain(workq)
    ctx.workq_rm(workq)
    assert ctx.workq is None
    assert workq.ctxs == ()


def test_workq_close_detaches_and_flushes(workq: WorkQ, ctx: TickCtx) -> None:
    """Style rule 7: closing a WorkQ detaches its contexts (flushing their jobs) first."""
    workq.submit(TickJob(ctx=ctx, ticks=5))
    workq.close()
    workq.close()
    assert ctx.workq is None
    assert ctx.num_inflight == 0
    assert ctx.running == []
    assert error_code(workq.progress_retrieve) is DocaErrorCode.BAD_STATE


# -- event-driven mode ----------------------------------------------------------------


def test_polling_workq_has_no_event_handle(workq: WorkQ) -> None:
    """DOCA Core 3.4 (doca_workq_get_event_handle/arm/clear): BAD_STATE unless event-driven."""
    for call in (workq.fileno, workq.arm, workq.clear):
        assert error_code(call) is DocaErrorCode.BAD_STATE


def test_event_mode_switches_only_without_contexts(workq: WorkQ, ctx: TickCtx) -> None:
    """DOCA Core 3.4 (doca_workq_set_event_driven_enable): BAD_STATE while a context is attached."""
    assert error_code(lambda: workq.set_event_driven(True)) is DocaErrorCode.BAD_STATE
    ctx.workq_rm(workq)
    workq.set_event_driven(True)
    assert workq.event_driven
    assert workq.fileno() >= 0


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


@pytest.fixture
def event_workq() -> Iterator[WorkQ]:
    with WorkQ(8, event_driven=True) as wq:
        yield wq


@pytest.fixture
def event_ctx(event_workq: WorkQ) -> Iterator[TickCtx]:
    with TickCtx() as c:
        c.workq_add(event_workq)
        c.start()
        yield c


def test_arm_signals_a_later_completion(event_workq: WorkQ, event_ctx: TickCtx) -> None:
    """DOCA Core 3.4 (doca_workq_event_handle_arm): armed, the handle turns readable on completion."""
    event_workq.arm()
    assert not _readable(event_workq.fileno())
    event_workq.submit(TickJob(ctx=event_ctx))  # completes at once
    assert _readable(event_workq.fileno())
    event_workq.clear()
    assert not _readable(event_workq.fileno())
    assert event_workq.progress_retrieve() is not None


def test_arm_with_an_event_waiting_fires_at_once(event_workq: WorkQ, event_ctx: TickCtx) -> None:
    """Arming while an event is ready makes the handle readable immediately: no lost wake-up."""
    event_workq.submit(TickJob(ctx=event_ctx))
    assert not _readable(event_workq.fileno())  # not armed
    event_workq.arm()
    assert _readable(event_workq.fileno())


def test_unarmed_completion_does_not_signal(event_workq: WorkQ, event_ctx: TickCtx) -> None:
    """DOCA Core 3.4: without arm, completions don't touch the handle (clear then arm is the loop)."""
    event_workq.arm()
    event_workq.submit(TickJob(ctx=event_ctx))
    event_workq.clear()
    event_workq.submit(TickJob(ctx=event_ctx))  # disarmed by the first signal
    assert not _readable(event_workq.fileno())


def test_handle_works_with_selectors_and_epoll(event_workq: WorkQ, event_ctx: TickCtx) -> None:
    """DOCA Core 3.4: the event handle is a real descriptor for selectors and epoll."""
    with selectors.DefaultSelector() as selector, select.epoll() as ep:
        selector.register(event_workq, selectors.EVENT_READ, "workq")
        ep.register(event_workq.fileno(), select.EPOLLIN)
        event_workq.arm()
        assert selector.select(timeout=0) == []
        assert ep.poll(0) == []
        event_workq.submit(TickJob(ctx=event_ctx))
        assert [key.data for key, _ in selector.select(timeout=0)] == ["workq"]
        assert ep.poll(0) == [(event_workq.fileno(), select.EPOLLIN)]


def test_context_descriptor_wakes_the_handle(event_workq: WorkQ) -> None:
    """A context's own descriptor (a sync event's update) makes the handle readable, armed or not."""
    with SyncEvent() as event:
        event.workq_add(event_workq)
        event.start()
        event_workq.submit(SyncEventWaitGtJob(ctx=event, value=0))
        assert not _readable(event_workq.fileno())
        event.update_set(1)
        assert _readable(event_workq.fileno())
        (done,) = _drain(event_workq, 1)
        assert done.result == 1
        assert not _readable(event_workq.fileno())  # progress consumed the context's signal


@pytest.mark.trio
async def test_handle_works_with_trio(event_workq: WorkQ) -> None:
    """DOCA Core 3.4: trio.lowlevel.wait_readable waits on the handle; the loop is retrieve/arm/wait/clear."""
    results: list[object] = []
    with SyncEvent() as event:
        event.workq_add(event_workq)
        event.start()
        event_workq.submit(SyncEventWaitGtJob(ctx=event, value=41, user_data="answer"))

        async def consumer() -> None:
            while not results:
                while (done := event_workq.progress_retrieve()) is not None:
                    results.append((done.user_data, done.result))
                if results:
                    return
                event_workq.arm()
                await trio.lowlevel.wait_readable(event_workq.fileno())
                event_workq.clear()

        async def publisher() -> None:
            for value in range(40, 43):
                await trio.lowlevel.checkpoint()
                event.update_set(value)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            nursery.start_soon(publisher)
    assert results == [("answer", 42)]
