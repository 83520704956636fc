"""DOCA Context (DOCA Core 3.4, ``doca_ctx.h``), as the job API (DOCA 2.0) and the task API (2.5+) run it.

A `Ctx` is the base of every library instance that runs jobs (DMA, RDMA,
sync event, graph). Its lifecycle is the table `_TRANSITIONS` below, from
``enum doca_ctx_states``::

    IDLE --start--> RUNNING                       (synchronous start)
    IDLE --start--> STARTING --connected--> RUNNING   (e.g. RDMA connecting)
    STARTING/RUNNING --stop--> STOPPING --drained--> IDLE

A pair the table doesn't list is BAD_STATE. Configuration (``add_dev`` and a
subclass's setters) is allowed only in IDLE; jobs are accepted only in
RUNNING. ``start`` and ``stop`` return SUCCESS, or IN_PROGRESS when the
context is left STARTING or STOPPING (``doca_ctx.h``). ``stop`` lets
in-flight work drain (or the subclass flushes it); the context reaches IDLE
when nothing is in flight, every task callback ran and every task was freed
(``doca_pe.h``, ``doca_task_free``). On a progress engine the asynchronous
transitions (STARTING -> RUNNING, STOPPING -> IDLE) and their state-changed
callbacks happen inside ``progress`` only. On a WorkQ (the DOCA 2.0 job API)
``stop`` is NOT_PERMITTED until ``workq_rm``, which is NOT_PERMITTED while
jobs are pending.

A `WorkQ` (``doca_workq``, `rdmakit.doca.workq`) accepts jobs for the
contexts attached to it, up to `depth` in flight (submitting more is
NO_MEMORY, as ``doca_workq_submit``), and hands back completions with
`WorkQ.progress_retrieve`. A context is attached to one WorkQ at a time; a
WorkQ serves any number of contexts.

``progress_retrieve()`` returns the next `Event`, or None when nothing is
ready: None is ``DOCA_ERROR_AGAIN``, the common case of a polling loop, so it
is a return value rather than an exception. A job that failed is still an
`Event`, with ``status`` IO_FAILED and the cause in ``error`` (as
``doca_workq_progress_retrieve`` returns IO_FAILED with the event filled in).
Misuse raises `DocaError`.

A `WorkQ` progresses through a `ProgressEngine` (``rdmakit.doca.pe``,
``doca_pe``): attaching a context to a WorkQ connects it to the WorkQ's
engine (its thread's, `thread_engine`, by default), and ``progress_retrieve``
runs that engine, which advances every context connected to it. The task API
of DOCA 2.5+ (``rdmakit.doca.tasks``) connects a context to an engine
directly (``ProgressEngine.connect_ctx``) and runs over the same `_dispatch`
and `_complete` as jobs; a task's completion counts as in flight until its
callback ran inside ``progress``, so STOPPING becomes IDLE only after that.

Event-driven mode: ``WorkQ(depth, event_driven=True)`` has an event handle,
`WorkQ.fileno` (an epoll set of an eventfd and the engine's notification
handle), for ``select``, ``selectors`` and ``trio.lowlevel.wait_readable``,
in the loop of ``doca_workq_event_handle_arm``: drain with
``progress_retrieve`` until None, ``arm()``, wait, ``clear()``, repeat.

Writing a context: subclass `Ctx`, implement `Ctx._submit` and
`Ctx._progress`, report each finished job with `Ctx._complete`; optionally
override `_start` (False: STARTING until `_connected`), `_stop`, `_cancel`,
`_close`, `_check_dev`, and `_watch_fd` descriptors that wake `_progress`.
"""

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, Generic, Protocol, Self, TypeVar

from rdmakit.doca.device import Dev
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.pe import ProgressEngine

__all__ = ["Ctx", "CtxState", "Event", "Job", "StateChangedCallback"]  # WorkQLike: for rdmakit.doca.workq


class CtxState(IntEnum):
    """``enum doca_ctx_states`` (``doca_ctx.h``)."""

    IDLE = 0  # created or stopped; configurable, no jobs
    STARTING = 1  # start called, asynchronous start (e.g. connecting) not finished
    RUNNING = 2  # accepts jobs
    STOPPING = 3  # stop called; in-flight jobs drain or are flushed


class _Input(Enum):
    START = "start"  # start(), the subclass is ready at once
    START_ASYNC = "start (asynchronous)"  # start(), the subclass is still connecting
    CONNECTED = "connected"
    STOP = "stop"
    DRAINED = "drained"  # the last in-flight job completed while stopping


_TRANSITIONS: dict[tuple[CtxState, _Input], CtxState] = {
    (CtxState.IDLE, _Input.START): CtxState.RUNNING,
    (CtxState.IDLE, _Input.START_ASYNC): CtxState.STARTING,
    (CtxState.STARTING, _Input.CONNECTED): CtxState.RUNNING,
    (CtxState.STARTING, _Input.STOP): CtxState.STOPPING,
    (CtxState.RUNNING, _Input.STOP): CtxState.STOPPING,
    (CtxState.STOPPING, _Input.DRAINED): CtxState.IDLE,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A request to a context (``struct doca_job``). Contexts subclass it with their arguments.

    A job object may be in flight once at a time (IN_USE otherwise); it can be
    submitted again after its event was delivered.
    """

    ctx: "Ctx[Any]"
    user_data: object = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """A completed job (``struct doca_event``)."""

    job: Job
    status: DocaErrorCode = DocaErrorCode.SUCCESS  # SUCCESS or IO_FAILED
    result: object = None  # per job type
    error: DocaError | None = None  # why it failed, when it did

    @property
    def user_data(self) -> object:
        return self.job.user_data

    @property
    def ok(self) -> bool:
        return self.status is DocaErrorCode.SUCCESS


J = TypeVar("J", bound=Job)
#: ``doca_ctx_state_changed_callback_t``: (ctx user data, ctx, previous state, next state).
StateChangedCallback = Callable[[object, "Ctx[Any]", CtxState, CtxState], None]


class _Sink(Protocol):
    """Where a context delivers the events of the jobs it was given: a WorkQ or a graph instance."""

    def _deliver(self, event: Event) -> None: ...


class WorkQLike(Protocol):
    """A WorkQ as a context sees it (`rdmakit.doca.workq.WorkQ`, which imports this module)."""

    @property
    def pe(self) -> ProgressEngine: ...
    @property
    def depth(self) -> int: ...
    @property
    def inflight(self) -> int: ...

    def submit(self, job: Job) -> None: ...

    def progress_retrieve(self) -> Event | None: ...

    def fileno(self) -> int: ...

    def arm(self) -> None: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...

    def _check_open(self) -> None: ...

    def _attach(self, ctx: "Ctx[Any]") -> None: ...

    def _detach(self, ctx: "Ctx[Any]") -> None: ...


class Ctx(Generic[J]):
    """The DOCA context base (``doca_ctx``); see the module docstring for the subclass contract."""

    def __init__(self) -> None:
        self._state = CtxState.IDLE
        self._state_cb: StateChangedCallback | None = None
        self._devs: list[Dev] = []
        self._workq: WorkQLike | None = None
        self._pending: dict[int, tuple[J, _Sink]] = {}
        self._fds: list[int] = []
        self._closed = False
        self._pe: ProgressEngine | None = None  # connected by ProgressEngine.connect_ctx (tasks)
        self._user_data: object = None
        self._held = 0  # tasks completed whose callback has not run yet (rdmakit.doca.tasks)
        self._task_confs: dict[type, Any] = {}  # task class -> its TaskConf (rdmakit.doca.tasks)

    # -- properties -------------------------------------------------------------

    @property
    def state(self) -> CtxState:
        return self._state

    @property
    def devs(self) -> tuple[Dev, ...]:
        return tuple(self._devs)

    @property
    def workq(self) -> WorkQLike | None:
        return self._workq

    @property
    def pe(self) -> ProgressEngine | None:
        """The engine progressing this context: the one it is connected to, or its WorkQ's."""
        return self._pe if self._pe is not None or self._workq is None else self._workq.pe

    @property
    def num_inflight(self) -> int:
        """Jobs and tasks in flight, a task until its callback ran (``doca_ctx_get_num_inflight_tasks``)."""
        return len(self._pending) + self._held

    @property
    def user_data(self) -> object:
        """What the state-changed and task callbacks get as ctx user data (``doca_ctx_get_user_data``)."""
        return self._user_data

    def set_user_data(self, user_data: object) -> None:
        """``doca_ctx_set_user_data``."""
        self._user_data = user_data

    @property
    def closed(self) -> bool:
        return self._closed

    # -- state machine ----------------------------------------------------------

    def _transition(self, event: _Input) -> None:
        prev = self._state
        nxt = _TRANSITIONS.get((prev, event))
        if nxt is None:
            raise DocaError(DocaErrorCode.BAD_STATE, f"{event.value} is not allowed in state {prev.name}")
        self._state = nxt
        if self._state_cb is not None:
            self._state_cb(self._user_data, self, prev, nxt)

    def _check_not_closed(self) -> None:
        if self._closed:
            raise DocaError(DocaErrorCode.BAD_STATE, "context is closed")

    def _require_idle(self, what: str) -> None:
        """For subclass setters: configuration is allowed only in IDLE."""
        self._check_not_closed()
        if self._state is not CtxState.IDLE:
            raise DocaError(DocaErrorCode.BAD_STATE, f"{what}: context is {self._state.name}, not IDLE")

    def set_state_changed_cb(self, cb: StateChangedCallback | None) -> None:
        """``cb(user_data, ctx, prev, next)`` after each transition (``doca_ctx_set_state_changed_cb``)."""
        self._state_cb = cb

    def start(self) -> DocaErrorCode:
        """Finalise the configuration and start (``doca_ctx_start``).

        SUCCESS when the context is RUNNING on return; IN_PROGRESS when it is
        STARTING (``doca_ctx.h``: "Asynchronous: Change state to started and
        return DOCA_ERROR_IN_PROGRESS"), e.g. an RDMA context until it connects.
        """
        self._check_not_closed()
        if (self._state, _Input.START) not in _TRANSITIONS:
            raise DocaError(DocaErrorCode.BAD_STATE, f"start is not allowed in state {self._state.name}")
        if self._workq is None and self._pe is None and self._task_confs:
            raise DocaError(
                DocaErrorCode.NOT_CONNECTED,
                "the context has task configurations but no progress engine (connect_ctx before start)",
                Fault.CALLER,
            )
        running = self._start()
        self._transition(_Input.START if running else _Input.START_ASYNC)
        return DocaErrorCode.SUCCESS if running else DocaErrorCode.IN_PROGRESS

    def _connected(self) -> None:
        """For subclasses: the asynchronous start finished (STARTING -> RUNNING).

        On a progress engine (DOCA 2.5+) the transition, and its state-changed
        callback, happen inside ``progress`` only (``doca_rdma.h``, connect:
        "Once called, doca_pe_progress() should be called, in order to
        transition the ctx to DOCA_CTX_STATE_RUNNING state"); on a WorkQ (the
        DOCA 2.0 job API, which has no STARTING state) at once.
        """
        pe = self._pe
        if pe is not None and not pe.in_progress:
            pe.defer(self._connected_in_progress)
            return
        self._transition(_Input.CONNECTED)

    def _connected_in_progress(self) -> None:
        if self._state is CtxState.STARTING and not self._closed:
            self._transition(_Input.CONNECTED)

    def stop(self) -> DocaErrorCode:
        """Stop accepting work (``doca_ctx_stop``): SUCCESS when IDLE on return, else IN_PROGRESS.

        Task API (DOCA 2.5+, ``doca_ctx.h``): with tasks in flight the context
        moves to STOPPING and the call returns IN_PROGRESS ("some tasks are
        still in progress. CTX will move to stopping state and a state changed
        callback shall be invoked when context is fully stopped"); the flushed
        tasks complete with an error inside ``progress``, and IDLE follows,
        inside ``progress``, once every task was freed (``doca_pe.h``,
        ``doca_task_free``: "All tasks MUST be freed in order for a context to
        be stopped").

        Job API (DOCA 2.0 ``doca_ctx.h``): NOT_PERMITTED while a WorkQ is
        attached ("either some jobs are still pending or not all WorkQs have
        been removed"): ``workq_rm`` first, which itself refuses while jobs are
        pending.
        """
        self._check_not_closed()
        if self._workq is not None:
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                f"{self._what()} is attached to {self._workq!r}: doca_ctx_workq_rm before stop",
                Fault.CALLER,
            )
        self._transition(_Input.STOP)
        self._stop()
        if self._drained():
            self._transition(_Input.DRAINED)
            return DocaErrorCode.SUCCESS
        return DocaErrorCode.IN_PROGRESS

    def _halt(self) -> None:
        """Stop for `close`: flush and reach IDLE now, whatever is attached or allocated."""
        if self._state in (CtxState.STARTING, CtxState.RUNNING):
            self._transition(_Input.STOP)
            self._stop()
        self._flush("context closed")
        if self._state is CtxState.STOPPING:  # callbacks still queued find it IDLE
            self._transition(_Input.DRAINED)

    def _what(self) -> str:
        return f"{type(self).__name__} context"

    @property
    def num_allocated_tasks(self) -> int:
        """Tasks allocated from this context and not freed (`rdmakit.doca.tasks`)."""
        return sum(conf.allocated for conf in self._task_confs.values())

    def _drained(self) -> bool:
        """Nothing in flight, every task callback ran and every task was freed."""
        return not self._pending and not self._held and not self.num_allocated_tasks

    def _check_drained(self) -> None:
        """STOPPING -> IDLE once `_drained`; on a progress engine inside ``progress`` only."""
        if self._state is not CtxState.STOPPING or not self._drained():
            return
        pe = self._pe
        if pe is not None and not pe.in_progress:
            pe.defer(self._check_drained)
            return
        self._transition(_Input.DRAINED)

    def _release_held(self) -> None:
        """For tasks: a completed task's callback ran."""
        self._held -= 1
        self._check_drained()

    # -- devices and work queue ---------------------------------------------------

    def add_dev(self, dev: Dev) -> None:
        """Give the context a device (``doca_ctx_dev_add``); IDLE only."""
        self._require_idle("add_dev")
        if dev in self._devs:
            raise DocaError(DocaErrorCode.IN_USE, f"{dev.name} was already added")
        self._check_dev(dev)
        dev._adopt(self)
        self._devs.append(dev)
        pe = self.pe
        if pe is not None:
            dev._share_with(pe)

    def rm_dev(self, dev: Dev) -> None:
        """Take a device away (``doca_ctx_dev_rm``); IDLE only."""
        self._require_idle("rm_dev")
        if dev not in self._devs:
            raise DocaError(DocaErrorCode.NOT_FOUND, f"{dev.name} was never added")
        self._devs.remove(dev)
        pe = self.pe
        if pe is not None:
            dev._unshare(pe)
        dev._disown(self)

    def workq_add(self, workq: WorkQLike) -> None:
        """Attach to `workq` (``doca_ctx_workq_add``); one WorkQ per context."""
        self._check_not_closed()
        workq._check_open()
        if self._workq is not None or self._pe is not None:
            raise DocaError(DocaErrorCode.IN_USE, "context is already attached to a WorkQ or an engine")
        workq.pe._connect(self)
        for dev in self._devs:
            dev._share_with(workq.pe)
        for fd in self._fds:
            workq.pe.watch(fd)
        workq._attach(self)
        self._workq = workq

    def workq_rm(self, workq: WorkQLike) -> None:
        """Detach from `workq`; NOT_PERMITTED while jobs are in flight (``doca_ctx_workq_rm``)."""
        self._check_not_closed()
        if self._workq is not workq:
            raise DocaError(DocaErrorCode.NOT_FOUND, "context is not attached to this WorkQ")
        if self._pending:
            raise DocaError(DocaErrorCode.NOT_PERMITTED, f"{len(self._pending)} jobs are in flight")
        self._detach_workq()

    def _detach_workq(self) -> None:
        workq, self._workq = self._workq, None
        if workq is not None:
            for dev in self._devs:
                dev._unshare(workq.pe)
            for fd in self._fds:
                workq.pe.unwatch(fd)
            workq.pe.disconnect_ctx(self)
            workq._detach(self)

    def _pe_connected(self, pe: ProgressEngine) -> None:
        """``ProgressEngine.connect_ctx`` (``doca_pe_connect_ctx``): `pe` progresses it, for tasks."""
        self._check_not_closed()
        if self._workq is not None or self._pe is not None:
            # doca_pe.h, doca_pe_connect_ctx: "DOCA_ERROR_NOT_PERMITTED - context is already connected
            # to a progress engine."
            raise DocaError(
                DocaErrorCode.NOT_PERMITTED,
                "a context can only be connected to one progress engine (or one WorkQ)",
                Fault.CALLER,
            )
        if self._state is not CtxState.IDLE:
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"connect_ctx: the context is {self._state.name}, not IDLE"
            )
        for dev in self._devs:
            dev._share_with(pe)
        for fd in self._fds:
            pe.watch(fd)
        self._pe = pe

    def _pe_disconnected(self, pe: ProgressEngine) -> None:
        if self._pe is pe:
            for dev in self._devs:
                dev._unshare(pe)
            for fd in self._fds:
                pe.unwatch(fd)
            self._pe = None

    def _watch_fd(self, fd: int) -> None:
        """For subclasses: `fd` becomes readable when `_progress` has work (event-driven mode)."""
        self._fds.append(fd)
        pe = self.pe
        if pe is not None:
            pe.watch(fd)

    def _unwatch_fd(self, fd: int) -> None:
        self._fds.remove(fd)
        pe = self.pe
        if pe is not None:
            pe.unwatch(fd)

    # -- jobs ----------------------------------------------------------------------------

    def _dispatch(self, job: J, sink: _Sink) -> None:
        """Start `job`, its event going to `sink` (a WorkQ or a graph instance)."""
        self._check_not_closed()
        if self._state is not CtxState.RUNNING:
            raise DocaError(DocaErrorCode.BAD_STATE, f"context is {self._state.name}, not RUNNING")
        key = id(job)
        if key in self._pending:
            raise DocaError(DocaErrorCode.IN_USE, "this job object is already in flight")
        self._pending[key] = (job, sink)
        try:
            self._submit(job)
        except BaseException:
            self._pending.pop(key, None)
            raise

    def _in_flight(self, job: J) -> bool:
        entry = self._pending.get(id(job))
        return entry is not None and entry[0] is job

    def _complete(
        self, job: J, *, result: object = None, error: DocaError | None = None, event: Event | None = None
    ) -> None:
        """For subclasses: `job` finished, successfully unless `error` is given.

        `event` is the finished event itself, when the subclass keeps one to reuse
        (a value: a resubmitted job's success is the same event each time).
        """
        entry = self._pending.get(id(job))
        if entry is None or entry[0] is not job:
            raise DocaError(DocaErrorCode.UNEXPECTED, f"{type(job).__name__} completed but is not in flight")
        del self._pending[id(job)]
        if event is None:
            status = DocaErrorCode.SUCCESS if error is None else DocaErrorCode.IO_FAILED
            event = Event(job=job, status=status, result=result, error=error)
        entry[1]._deliver(event)
        if self._state is CtxState.STOPPING:
            self._check_drained()

    def _flush(self, reason: str) -> None:
        """Complete every in-flight job as failed with SHUTDOWN."""
        if not self._pending:
            return
        self._cancel()
        for job, _ in list(self._pending.values()):
            self._complete(job, error=DocaError(DocaErrorCode.SHUTDOWN, f"job flushed: {reason}"))

    # -- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        """Stop (flushing what doesn't drain), leave the WorkQ and the devices. Idempotent.

        ``doca_<ctx>_destroy`` refuses a context that is not stopped (BAD_STATE);
        `close` is the Python resource release and tears down whatever is left,
        so ``with`` blocks and error paths cannot leak a queue pair.
        """
        if self._closed:
            return
        self._halt()
        self._detach_workq()
        if self._pe is not None:
            self._pe.disconnect_ctx(self)
        for dev in self._devs:
            dev._disown(self)
        self._devs.clear()
        for fd in list(self._fds):
            self._unwatch_fd(fd)
        self._close()
        self._closed = True

    def _on_dev_close(self, dev: Dev) -> None:
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- subclass hooks ------------------------------------------------------------

    def _check_dev(self, dev: Dev) -> None:
        """Raise NOT_SUPPORTED if `dev` cannot serve this context."""

    def _start(self) -> bool:
        """Allocate resources; True if RUNNING at once, False to stay STARTING until `_connected`."""
        return True

    def _stop(self) -> None:
        """Stop was requested; in-flight jobs drain unless this flushes them (`_flush`)."""

    def _submit(self, job: J) -> None:
        """Start `job`; report its end with `_complete`, now or from `_progress`."""
        raise DocaError(DocaErrorCode.NOT_SUPPORTED, f"{type(self).__name__} runs no jobs")

    def _progress(self) -> bool:
        """Advance without blocking, calling `_complete` for finished jobs; True if anything happened."""
        return False

    def _cancel(self) -> None:
        """Every in-flight job is about to be flushed: forget them; none may be completed later."""

    def _close(self) -> None:
        """Release the subclass's resources."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._state.name} inflight={len(self._pending)}>"
