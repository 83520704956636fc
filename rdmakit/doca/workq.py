"""The DOCA 2.0 work queue (``doca_workq``, DOCA Core 3.4): submission, progress and retrieval of jobs.

A `WorkQ` accepts jobs for the contexts attached to it, up to `depth` in
flight (submitting more is NO_MEMORY, as ``doca_workq_submit``), and hands
back completions with `WorkQ.progress_retrieve`. The context side of the
contract (``_dispatch``, ``_complete``, ``workq_add``/``workq_rm``) is
``rdmakit.doca.ctx``'s; see its docstring for the event-driven loop.
"""

import contextlib
import os
import select
from collections import deque
from typing import Any, Self

from rdmakit.doca.ctx import Ctx, Event, Job
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.pe import ProgressEngine, thread_engine

__all__ = ["WorkQ"]


class WorkQ:
    """A DOCA work queue (``doca_workq``): submission, progress and completion retrieval."""

    def __init__(self, depth: int, *, event_driven: bool = False, pe: ProgressEngine | None = None) -> None:
        """A WorkQ of `depth` jobs progressed by `pe` (None: the calling thread's engine)."""
        if depth <= 0:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"depth must be positive, got {depth}")
        self._pe = pe if pe is not None else thread_engine()
        self._depth = depth
        self._inflight = 0
        self._ctxs: list[Ctx[Any]] = []
        self._ready: deque[Event] = deque()
        self._armed = False
        self._epoll: select.epoll | None = None
        self._efd = -1
        self._closed = False
        if event_driven:
            self._open_handle()

    # -- properties -----------------------------------------------------------

    @property
    def depth(self) -> int:
        """Most jobs in flight, counting completed ones not yet retrieved."""
        return self._depth

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def pe(self) -> ProgressEngine:
        """The progress engine this WorkQ's contexts are connected to."""
        return self._pe

    @property
    def event_driven(self) -> bool:
        return self._epoll is not None

    @property
    def ctxs(self) -> tuple["Ctx[Any]", ...]:
        return tuple(self._ctxs)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise DocaError(DocaErrorCode.BAD_STATE, "WorkQ is closed")

    # -- event handle -----------------------------------------------------------

    def _open_handle(self) -> None:
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._efd, select.EPOLLIN)
        self._epoll.register(self._pe.fileno(), select.EPOLLIN)

    def _close_handle(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
            os.close(self._efd)
            self._epoll, self._efd, self._armed = None, -1, False

    def set_event_driven(self, enable: bool) -> None:
        """Switch event-driven mode, with no context attached (``doca_workq_set_event_driven_enable``)."""
        self._check_open()
        if self._ctxs:
            raise DocaError(DocaErrorCode.BAD_STATE, "contexts are attached to the WorkQ")
        if enable and self._epoll is None:
            self._open_handle()
        elif not enable:
            self._close_handle()

    def _require_event_driven(self) -> select.epoll:
        self._check_open()
        if self._epoll is None:
            raise DocaError(DocaErrorCode.BAD_STATE, "WorkQ is not in event-driven mode")
        return self._epoll

    def fileno(self) -> int:
        """The event handle (``doca_workq_get_event_handle``): readable when there is work."""
        return self._require_event_driven().fileno()

    @property
    def event_handle(self) -> int:
        return self.fileno()

    def arm(self) -> None:
        """Make the handle readable on the next completion (``doca_workq_event_handle_arm``).

        If an event is already waiting, the handle becomes readable at once.
        """
        self._require_event_driven()
        if self._ready:
            os.eventfd_write(self._efd, 1)
        else:
            self._armed = True

    def clear(self) -> None:
        """Reset the handle after it fired (``doca_workq_event_handle_clear``)."""
        self._require_event_driven()
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)

    # -- jobs -------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Hand `job` to its context (``doca_workq_submit``).

        NOT_FOUND if the context isn't attached here, NO_MEMORY when `depth`
        jobs are in flight, BAD_STATE unless the context is RUNNING, IN_USE if
        this job object is already in flight; the context may raise more.
        """
        if self._closed:
            self._check_open()
        ctx = job.ctx
        if ctx._workq is not self:
            raise DocaError(DocaErrorCode.NOT_FOUND, f"{ctx!r} is not attached to this WorkQ")
        if self._inflight >= self._depth:
            raise DocaError(
                DocaErrorCode.NO_MEMORY, f"WorkQ is full: {self._depth} jobs in flight", Fault.CALLER
            )
        self._inflight += 1
        try:
            ctx._dispatch(job, self)
        except BaseException:
            self._inflight -= 1
            raise

    def progress_retrieve(self) -> Event | None:
        """Run the WorkQ's engine (its devices and contexts); one completed `Event`, or None (AGAIN)."""
        if self._closed:
            self._check_open()
        ready = self._ready
        if not ready:
            self._pe.progress()
            if not ready:
                return None
        self._inflight -= 1
        return ready.popleft()

    def _deliver(self, event: Event) -> None:
        self._ready.append(event)
        if self._armed:
            self._armed = False
            os.eventfd_write(self._efd, 1)

    # -- lifetime ---------------------------------------------------------------

    def close(self) -> None:
        """Detach every context (flushing its in-flight jobs) and release the handle. Idempotent."""
        if self._closed:
            return
        for ctx in list(self._ctxs):
            ctx._flush("WorkQ closed")
            ctx._detach_workq()
        self._ready.clear()
        self._inflight = 0
        self._close_handle()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "event-driven" if self._epoll is not None else "polling"
        return f"<WorkQ depth={self._depth} inflight={self._inflight} {mode}>"

    def _attach(self, ctx: Ctx[Any]) -> None:
        self._ctxs.append(ctx)

    def _detach(self, ctx: Ctx[Any]) -> None:
        self._ctxs.remove(ctx)
