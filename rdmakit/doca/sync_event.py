"""DOCA Sync Event (DOCA Core 3.5, ``doca_sync_event.h``), within one process.

A `SyncEvent` holds a 64-bit counter. Publishers update it (`update_set`,
`update_add`); subscribers read it (`get`) or wait for it (`wait_gt`,
`wait_eq`, comparing ``value & mask``). Each operation exists twice:

- as a direct call, usable from any thread; the waits block (with an optional
  timeout: TIME_OUT);
- as a job (`SyncEventGetJob`, `SyncEventSetJob`, `SyncEventAddJob`,
  `SyncEventWaitGtJob`, `SyncEventWaitEqJob`) submitted to the WorkQ the
  event is attached to. Get/set/add complete at once; a wait completes when
  a later update satisfies it, and in event-driven mode the WorkQ handle
  becomes readable then, even when the update came from another thread.

The event is a context: it must be started before use and a stop fails
pending waits (SHUTDOWN). Arithmetic is modulo 2**64, like the C ``uint64_t``.
Publisher/subscriber locations (CPU, DPU, GPU, remote) are not modelled: both
sides are this process's CPU.
"""

import contextlib
import os
import threading
from dataclasses import dataclass

from rdmakit.doca.ctx import Ctx, CtxState, Job
from rdmakit.doca.errors import DocaError, DocaErrorCode

__all__ = [
    "U64_MAX",
    "SyncEvent",
    "SyncEventAddJob",
    "SyncEventGetJob",
    "SyncEventSetJob",
    "SyncEventWaitEqJob",
    "SyncEventWaitGtJob",
]

U64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventGetJob(Job):
    """Read the value; the event's ``result`` is it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventSetJob(Job):
    """Set the value to `value`."""

    value: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventAddJob(Job):
    """Add `value` (mod 2**64); the event's ``result`` is the value before."""

    value: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventWaitGtJob(Job):
    """Complete once ``current & mask > value``; ``result`` is the value seen."""

    value: int
    mask: int = U64_MAX


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncEventWaitEqJob(Job):
    """Complete once ``current & mask == value``; ``result`` is the value seen."""

    value: int
    mask: int = U64_MAX


_WaitJob = SyncEventWaitGtJob | SyncEventWaitEqJob


def _check_u64(name: str, value: int) -> None:
    if type(value) is not int or not 0 <= value <= U64_MAX:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"{name} {value!r} is not a 64-bit unsigned value")


def _satisfied(job: _WaitJob, current: int) -> bool:
    masked = current & job.mask
    if isinstance(job, SyncEventWaitGtJob):
        return masked > job.value
    return masked == job.value


class SyncEvent(Ctx[Job]):
    """A 64-bit event counter shared by publishers and subscribers (``doca_sync_event``)."""

    def __init__(self) -> None:
        super().__init__()
        self._value = 0
        self._cond = threading.Condition()
        self._waits: list[_WaitJob] = []
        self._efd = -1

    def _start(self) -> bool:
        if self._efd < 0:  # kept across stop/start; closed by close()
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._watch_fd(self._efd)
        return True

    def _stop(self) -> None:
        with self._cond:
            self._cond.notify_all()  # blocked waiters see the state and give up
        self._flush("sync event stopped")

    def _cancel(self) -> None:
        self._waits.clear()

    def _close(self) -> None:
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1

    def _check_running(self) -> None:
        if self._state is not CtxState.RUNNING:
            raise DocaError(DocaErrorCode.BAD_STATE, f"sync event is {self._state.name}, not RUNNING")

    # -- direct calls -------------------------------------------------------------

    def get(self) -> int:
        """The current value (``doca_sync_event_get``)."""
        self._check_running()
        return self._value

    def _publish(self, value: int) -> None:
        # Caller holds self._cond.
        self._value = value
        self._cond.notify_all()
        if self._efd >= 0:
            os.eventfd_write(self._efd, 1)

    def update_set(self, value: int) -> None:
        """Set the value (``doca_sync_event_update_set``)."""
        self._check_running()
        _check_u64("value", value)
        with self._cond:
            self._publish(value)

    def update_add(self, value: int) -> int:
        """Add `value` modulo 2**64 and return the value before (``doca_sync_event_update_add``)."""
        self._check_running()
        _check_u64("value", value)
        with self._cond:
            before = self._value
            self._publish((before + value) & U64_MAX)
        return before

    def _wait(self, job: _WaitJob, timeout: float | None) -> int:
        self._check_running()
        _check_u64("value", job.value)
        _check_u64("mask", job.mask)
        with self._cond:
            done = self._cond.wait_for(
                lambda: self._state is not CtxState.RUNNING or _satisfied(job, self._value),
                timeout,
            )
            if self._state is not CtxState.RUNNING:
                raise DocaError(DocaErrorCode.SHUTDOWN, "sync event stopped while waiting")
            if not done:
                raise DocaError(DocaErrorCode.TIME_OUT, f"sync event wait timed out after {timeout}s")
            return self._value

    def wait_gt(self, value: int, *, mask: int = U64_MAX, timeout: float | None = None) -> int:
        """Block until ``current & mask > value``; returns the value seen (``doca_sync_event_wait_gt``)."""
        return self._wait(SyncEventWaitGtJob(ctx=self, value=value, mask=mask), timeout)

    def wait_eq(self, value: int, *, mask: int = U64_MAX, timeout: float | None = None) -> int:
        """Block until ``current & mask == value``; returns the value seen."""
        return self._wait(SyncEventWaitEqJob(ctx=self, value=value, mask=mask), timeout)

    # -- jobs -------------------------------------------------------------------------

    def _submit(self, job: Job) -> None:
        match job:
            case SyncEventGetJob():
                self._complete(job, result=self._value)
            case SyncEventSetJob(value=value):
                self.update_set(value)
                self._complete(job)
            case SyncEventAddJob(value=value):
                self._complete(job, result=self.update_add(value))
            case SyncEventWaitGtJob() | SyncEventWaitEqJob():
                _check_u64("value", job.value)
                _check_u64("mask", job.mask)
                current = self._value
                if _satisfied(job, current):
                    self._complete(job, result=current)
                else:
                    self._waits.append(job)
            case _:
                raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{type(job).__name__} is not a sync event job")

    def _progress(self) -> bool:
        if self._efd >= 0:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._efd)
        if not self._waits:
            return False
        current = self._value
        done = [job for job in self._waits if _satisfied(job, current)]
        for job in done:
            self._waits.remove(job)
            self._complete(job, result=current)
        return bool(done)

    def __repr__(self) -> str:
        return f"<SyncEvent {self._state.name} value={self._value} waits={len(self._waits)}>"
