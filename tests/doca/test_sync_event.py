"""DOCA Core 3.5: the sync event (doca_sync_event.h), within one process."""

import threading

import pytest

from rdmakit.doca import (
    U64_MAX,
    CtxState,
    DocaError,
    DocaErrorCode,
    Event,
    Job,
    SyncEvent,
    SyncEventAddJob,
    SyncEventGetJob,
    SyncEventSetJob,
    SyncEventWaitEqJob,
    SyncEventWaitGtJob,
    WorkQ,
)
from tests.doca.util import error_code


def _run(workq: WorkQ, job: Job) -> Event:
    workq.submit(job)
    done = workq.progress_retrieve()
    assert done is not None
    assert done.job is job
    return done


def test_must_be_started() -> None:
    """DOCA Core 3.5: a sync event is used only once started (BAD_STATE)."""
    event = SyncEvent()
    for call in (event.get, lambda: event.update_set(1), lambda: event.wait_gt(0, timeout=0)):
        assert error_code(call) is DocaErrorCode.BAD_STATE


def test_set_get_add(event: SyncEvent) -> None:
    """DOCA Core 3.5 (update_set/update_add/get): add returns the value before, arithmetic mod 2**64."""
    assert event.get() == 0
    event.update_set(U64_MAX - 1)
    assert event.update_add(3) == U64_MAX - 1
    assert event.get() == 1


@pytest.mark.parametrize("value", [-1, 1 << 64, 1.5, True])
def test_values_are_u64(event: SyncEvent, value: object) -> None:
    """DOCA Core 3.5: values are uint64_t; anything else is INVALID_VALUE."""
    assert error_code(lambda: event.update_set(value)) is DocaErrorCode.INVALID_VALUE  # type: ignore[arg-type]
    assert error_code(lambda: event.update_add(value)) is DocaErrorCode.INVALID_VALUE  # type: ignore[arg-type]
    assert event.get() == 0


def test_wait_gt_and_eq_return_at_once_when_true(event: SyncEvent) -> None:
    """DOCA Core 3.5 (wait_gt): a satisfied condition returns the value seen, masked comparison."""
    event.update_set(0x1F0)
    assert event.wait_gt(0x100) == 0x1F0
    assert event.wait_eq(0xF0, mask=0xFF) == 0x1F0
    assert error_code(lambda: event.wait_gt(0xF0, mask=0x0F, timeout=0)) is DocaErrorCode.TIME_OUT


def test_wait_blocks_until_another_thread_publishes(event: SyncEvent) -> None:
    """DOCA Core 3.5: a subscriber's wait ends when a publisher (another thread) updates the value."""
    seen: list[int] = []
    waiting = threading.Event()

    def subscriber() -> None:
        waiting.set()
        seen.append(event.wait_eq(3))

    thread = threading.Thread(target=subscriber)
    thread.start()
    waiting.wait()
    for _ in range(3):
        event.update_add(1)
    thread.join()
    assert seen == [3]


def test_stop_wakes_blocked_waiters_with_shutdown(event: SyncEvent) -> None:
    """A thread blocked in a wait gets SHUTDOWN when the event stops."""
    errors: list[DocaErrorCode] = []

    def subscriber() -> None:
        try:
            event.wait_gt(10)
        except DocaError as exc:
            errors.append(exc.code)

    thread = threading.Thread(target=subscriber)
    thread.start()
    blocked = threading.Event()
    while thread.is_alive() and not event._cond._waiters:  # type: ignore[attr-defined]  # until it waits
        blocked.wait(0.001)
    wq = event.workq
    assert wq is not None
    event.workq_rm(wq)  # DOCA 2.0 doca_ctx_stop: NOT_PERMITTED while a WorkQ is attached
    event.stop()
    thread.join()
    assert errors == [DocaErrorCode.SHUTDOWN]


def test_get_set_add_jobs(workq: WorkQ, event: SyncEvent) -> None:
    """DOCA Core 3.5: get, set and add as jobs; add's result is the value before."""
    assert _run(workq, SyncEventSetJob(ctx=event, value=5)).ok
    assert _run(workq, SyncEventAddJob(ctx=event, value=2)).result == 5
    assert _run(workq, SyncEventGetJob(ctx=event)).result == 7


def test_wait_job_completes_on_a_later_update(workq: WorkQ, event: SyncEvent) -> None:
    """DOCA Core 3.5: a wait job stays in flight until an update satisfies it."""
    gt = SyncEventWaitGtJob(ctx=event, value=1)
    eq = SyncEventWaitEqJob(ctx=event, value=0x20, mask=0xF0)
    workq.submit(gt)
    workq.submit(eq)
    assert workq.progress_retrieve() is None
    event.update_set(2)
    done = workq.progress_retrieve()
    assert done is not None
    assert (done.job, done.result) == (gt, 2)
    assert workq.progress_retrieve() is None
    event.update_set(0x125)
    done = workq.progress_retrieve()
    assert done is not None
    assert (done.job, done.result) == (eq, 0x125)


def test_invalid_wait_job_is_rejected_at_submit(workq: WorkQ, event: SyncEvent) -> None:
    """DOCA Core 3.5: a job with a value outside uint64_t raises INVALID_VALUE at submission."""
    assert (
        error_code(lambda: workq.submit(SyncEventWaitGtJob(ctx=event, value=-1)))
        is DocaErrorCode.INVALID_VALUE
    )
    assert workq.inflight == 0


def test_foreign_job_is_not_supported(workq: WorkQ, event: SyncEvent) -> None:
    """A job type the sync event doesn't run is NOT_SUPPORTED."""
    assert error_code(lambda: workq.submit(Job(ctx=event))) is DocaErrorCode.NOT_SUPPORTED


def test_stop_fails_pending_waits(workq: WorkQ, event: SyncEvent) -> None:
    """DOCA 2.0 ``doca_ctx.h``: stop is NOT_PERMITTED while a WorkQ is attached, and doca_ctx_workq_rm
    while "some jobs are still pending completion"; once the wait completed, both go through."""
    wait = SyncEventWaitGtJob(ctx=event, value=100)
    workq.submit(wait)
    assert error_code(event.stop) is DocaErrorCode.NOT_PERMITTED
    assert error_code(lambda: event.workq_rm(workq)) is DocaErrorCode.NOT_PERMITTED
    event.update_set(101)
    done = workq.progress_retrieve()
    assert done is not None
    assert done.job is wait
    assert done.ok
    event.workq_rm(workq)
    assert event.stop() is DocaErrorCode.SUCCESS
    assert event.state is CtxState.IDLE
    event.workq_add(workq)
    event.start()  # restartable
    assert _run(workq, SyncEventGetJob(ctx=event)).ok
