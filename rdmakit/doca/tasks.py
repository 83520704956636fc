"""DOCA tasks (DOCA 2.5+, ``doca_pe.h`` and ``doca_ctx.h``): the task API over the job core.

DOCA 2.5 replaced the work queue and its jobs (``doca_workq``, ``doca_job``)
with the progress engine (``doca_pe``) and tasks. The flow, as in the DOCA
samples (``pe_polling_sample.c``, ``rdma_write_requester_sample.c``)::

    pe = PE()
    pe.connect_ctx(rdma)                                  # doca_pe_connect_ctx
    rdma.task_write_set_conf(on_done, on_error, 16)       # per task type, IDLE only
    rdma.set_state_changed_cb(on_state)                   # doca_ctx_set_state_changed_cb
    rdma.start() ... rdma.connect(peer)                   # RUNNING
    task = rdma.task_write_allocate_init(src, dst, user_data)
    task.submit()                                         # doca_task_submit
    while not done:
        pe.progress()                                     # callbacks run in here only

Every task type of a context has a pool of ``num_tasks`` (`set_conf`);
allocating past it, or a type never configured, is NO_MEMORY ("no more tasks
to allocate", ``doca_rdma.h``); `Task.free` returns a task to its pool, also
from inside its own callback. A task is allocated and submitted in RUNNING
only (``enum doca_ctx_states``: "ctx can allocate tasks, submit tasks").
As in DOCA the pool's task objects are reused: ``set_conf`` makes the first
`PREALLOCATED` of them, the rest are made the first time they are taken, and
a freed task joins the back of the pool's queue, ``allocate_init`` taking
from the front, so allocating, submitting and freeing tasks allocates nothing
once the pool is warm. A stale reference to a freed task may then see it
allocated again, as a stale ``doca_task`` pointer would in C.

Completion (``doca_task_completion_cb_t``): ``cb(task, task_user_data,
ctx_user_data)``, the success callback when the task's status
(`Task.get_status`, ``doca_task_get_status``) is SUCCESS, else the error
callback. The callback owns the task: it may submit it again, free it, or
keep it. Callbacks run inside `ProgressEngine.progress` only: a completion
that happens during ``submit`` (a connection already in ERROR) or ``stop``
(the flush) is queued and runs in the next ``progress``, never on another
thread.

Stop (``doca_ctx_stop``, ``pe_async_stop_sample.c``): stopping a context with
tasks in flight moves it to STOPPING; the tasks are flushed (status
SHUTDOWN, the job API's flush status, unless the context drains them, as
DMA does) and their error callbacks run in ``progress``; the context reaches
IDLE, with its state-changed callback, after the last of them.

One core: a task is a mutable front for the context's job of the same kind.
``submit`` builds that job (kept while its fields are the task's: across
submits, and across ``free`` and ``allocate_init`` when they are the same)
and hands it to the context's ``_dispatch`` with the task as the sink,
exactly as a `WorkQ` hands a job with itself as the sink; the context plans,
posts and completes it with the same code, and the task keeps the `Event`'s
status and result. The job API and the task API differ only in where
completions go.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar

from rdmakit.doca.ctx import Ctx, CtxState, Event, Job
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault

if TYPE_CHECKING:
    from rdmakit.doca.pe import ProgressEngine

__all__ = ["Task", "TaskCallback", "TaskConf", "TaskState"]

U32 = (1 << 32) - 1
#: Task objects of a type that ``set_conf`` makes at once (the rest of the pool on first use).
PREALLOCATED = 64

T = TypeVar("T", bound="Task")
#: ``doca_task_completion_cb_t`` and the per-type callbacks: (task, task user data, ctx user data).
TaskCallback = Callable[[T, object, object], None]


def _values(names: tuple[str, ...]) -> Callable[[Any], tuple[object, ...]]:
    """The named attributes of an object, as a tuple (one name too)."""
    get = attrgetter(*names)
    return get if len(names) > 1 else lambda obj: (get(obj),)


class TaskState(Enum):
    """Who owns a task (``doca_pe.h``: ownership passes to DOCA on submit and back on completion)."""

    ALLOCATED = "allocated"  # the user's: not submitted yet, or its callback ran
    SUBMITTED = "submitted"  # DOCA's: in flight, or completed with its callback not run yet
    FREED = "freed"  # back in the pool


@dataclass(slots=True)
class TaskConf(Generic[T]):
    """One task type's configuration on a context (``doca_<ctx>_task_<type>_set_conf``)."""

    success_cb: TaskCallback[T]
    error_cb: TaskCallback[T]
    num_tasks: int
    allocated: int = 0
    idle: deque[T] = field(default_factory=deque)  # the pool's objects not allocated, oldest first


def set_task_conf(
    ctx: Ctx[Any], kind: type[T], success_cb: TaskCallback[T], error_cb: TaskCallback[T], num_tasks: int
) -> None:
    """Configure `kind` tasks on `ctx`: INVALID_VALUE for bad input, BAD_STATE unless IDLE."""
    ctx._require_idle(f"{kind.__name__} set_conf")
    if not callable(success_cb) or not callable(error_cb):
        raise DocaError(DocaErrorCode.INVALID_VALUE, "the success and error callbacks must be callable")
    if type(num_tasks) is not int or not 1 <= num_tasks <= U32:
        raise DocaError(DocaErrorCode.INVALID_VALUE, f"num_tasks must be a positive u32, got {num_tasks!r}")
    conf: TaskConf[T] | None = ctx._task_confs.get(kind)
    if conf is None:
        conf = ctx._task_confs[kind] = TaskConf(success_cb, error_cb, num_tasks)
    else:  # tasks still allocated keep counting against the pool
        conf.success_cb, conf.error_cb, conf.num_tasks = success_cb, error_cb, num_tasks
    more = min(num_tasks, PREALLOCATED) - conf.allocated - len(conf.idle)
    conf.idle.extend(kind._blank() for _ in range(more))


class Task:
    """A DOCA task (``struct doca_task``); subclasses are the task types of each context."""

    __slots__ = (
        "_completions",
        "_conf",
        "_ctx",
        "_dirty",
        "_error",
        "_finish_cb",
        "_job",
        "_pe",
        "_result",
        "_state",
        "_status",
        "_user_data",
    )

    _job: Job | None  # built by submit, kept while it fits the task's fields
    _dirty: bool  # a field may have changed since `_job` was built
    _finish_cb: Callable[[], None]  # `_finish`, bound once

    #: The C name of the type, for messages, e.g. ``doca_rdma_task_write``.
    doca_name = "doca_task"
    #: The job a task of this type runs, and which of its fields come from which of the task's
    #: (task attribute, job field); a type without them defines `_make_job` itself.
    _job_class: ClassVar[type[Job] | None] = None
    _job_fields: ClassVar[tuple[tuple[str, str], ...]] = ()
    # Made from `_job_fields`: the task's values, the job's, and the job's field names, in order.
    _task_values: ClassVar[Callable[[Any], tuple[object, ...]]]
    _job_values: ClassVar[Callable[[Any], tuple[object, ...]]]
    _job_names: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_job_fields" in cls.__dict__:
            mine, theirs = zip(*cls._job_fields, strict=True)
            cls._task_values = _values(mine)
            cls._job_values = _values(theirs)
            cls._job_names = theirs

    @classmethod
    def _blank(cls) -> Self:
        """A task object of the pool, to be initialised when it is allocated."""
        task = object.__new__(cls)
        task._job = None
        task._finish_cb = task._finish  # made once: completions defer it without allocating
        return task

    def __new__(cls, ctx: Ctx[Any], *args: object, **kwargs: object) -> Self:
        # The pool's next idle object (`__init__` takes it once its checks pass), else a new one.
        conf: TaskConf[Any] | None = ctx._task_confs.get(cls)
        if conf is not None and conf.idle:
            task: Self = conf.idle[0]
            return task
        return cls._blank()

    def __init__(self, ctx: Ctx[Any], user_data: object) -> None:
        """Take a task from `ctx`'s pool of this type (the ``*_alloc_init`` functions)."""
        ctx._check_not_closed()
        conf: TaskConf[Any] | None = ctx._task_confs.get(type(self))
        if conf is None:
            raise DocaError(
                DocaErrorCode.NO_MEMORY,
                f"no {self.doca_name} tasks to allocate: configure them with set_conf before start",
                Fault.CALLER,
            )
        if ctx.state is not CtxState.RUNNING:
            raise DocaError(
                DocaErrorCode.BAD_STATE, f"tasks are allocated in RUNNING; the context is {ctx.state.name}"
            )
        if conf.allocated >= conf.num_tasks:
            raise DocaError(
                DocaErrorCode.NO_MEMORY,
                f"no more {self.doca_name} tasks to allocate: all {conf.num_tasks} are allocated "
                "(free some, or configure more with set_conf)",
                Fault.CALLER,
            )
        conf.allocated += 1
        idle = conf.idle
        if idle and idle[0] is self:
            idle.popleft()
        self._ctx = ctx
        self._conf = conf
        self._user_data = user_data
        self._state = TaskState.ALLOCATED
        self._status = DocaErrorCode.SUCCESS
        self._error: DocaError | None = None
        self._result: object = None
        self._dirty = True  # the subclass sets the fields: check the kept job at the next submit
        self._pe: ProgressEngine | None = None
        self._completions = 0  # callbacks run so far (rdmakit.doca.aio waits on it)

    # -- what a task type defines -------------------------------------------------------------

    def _make_job(self) -> Job:
        """The context's job for this task's current fields (`_job_fields` of `_job_class`)."""
        if self._job_class is None:
            raise NotImplementedError
        cls = type(self)
        return self._job_class(
            ctx=self._ctx, **dict(zip(cls._job_names, cls._task_values(self), strict=True))
        )

    def _job_fits(self, job: Job) -> bool:
        """Whether `job` is the one `_make_job` would build now (only with `_job_fields`)."""
        if self._job_class is None or type(job) is not self._job_class or job.ctx is not self._ctx:
            return False
        cls = type(self)
        return cls._job_values(job) == cls._task_values(self)

    def _changed(self) -> None:
        """For setters: the job is checked, and built again if it differs, at the next submit."""
        self._dirty = True

    # -- doca_task ------------------------------------------------------------------------------

    def as_task(self) -> Self:
        """``doca_<ctx>_task_<type>_as_task``: the task itself."""
        return self

    @property
    def ctx(self) -> Ctx[Any]:
        return self._ctx

    def get_ctx(self) -> Ctx[Any]:
        """The context that allocated the task (``doca_task_get_ctx``)."""
        return self._ctx

    @property
    def state(self) -> TaskState:
        return self._state

    @property
    def user_data(self) -> object:
        return self._user_data

    def get_user_data(self) -> object:
        """``doca_task_get_user_data``."""
        return self._user_data

    def set_user_data(self, user_data: object) -> None:
        """``doca_task_set_user_data``."""
        self._user_data = user_data

    def get_status(self) -> DocaErrorCode:
        """SUCCESS, or why the task failed (``doca_task_get_status``); valid once completed."""
        return self._status

    @property
    def error(self) -> DocaError | None:
        """The failure behind `get_status`, with its message and fault; None on success."""
        return self._error

    def submit(self) -> None:
        """Hand the task to its context (``doca_task_submit``); on an error the caller keeps it.

        IN_USE if it is already submitted, BAD_STATE once freed or unless the
        context is RUNNING, NOT_CONNECTED if the context has no progress
        engine; the context's own checks of the buffers raise as for a job.
        """
        if self._state is not TaskState.ALLOCATED:
            if self._state is TaskState.SUBMITTED:
                raise DocaError(DocaErrorCode.IN_USE, f"this {self.doca_name} task is already submitted")
            raise DocaError(DocaErrorCode.BAD_STATE, f"this {self.doca_name} task was freed")
        ctx = self._ctx
        pe = ctx._pe if ctx._pe is not None else ctx.pe  # connected (the task API), else its WorkQ's
        if pe is None:
            raise DocaError(
                DocaErrorCode.NOT_CONNECTED, "the context is not connected to a progress engine (connect_ctx)"
            )
        job = self._job
        if job is None or self._dirty:
            if job is None or not self._job_fits(job):
                job = self._job = self._make_job()
            self._dirty = False
        self._pe = pe
        self._state = TaskState.SUBMITTED
        try:
            ctx._dispatch(job, self)
        except BaseException:
            self._state = TaskState.ALLOCATED
            raise
        if pe._armed:
            pe.notify()  # a waiter asleep on the handle must progress the new work

    def try_submit(self) -> None:
        """``doca_task_try_submit``: the task is validated before it is submitted, as by `submit`."""
        self.submit()

    def free(self) -> None:
        """Return the task to its context's pool (``doca_task_free``); also inside its callback.

        IN_USE while submitted (DOCA owns it); BAD_STATE if already freed.
        """
        if self._state is not TaskState.ALLOCATED:
            if self._state is TaskState.SUBMITTED:
                raise DocaError(DocaErrorCode.IN_USE, f"this {self.doca_name} task is submitted")
            raise DocaError(DocaErrorCode.BAD_STATE, f"this {self.doca_name} task was already freed")
        self._state = TaskState.FREED
        conf = self._conf
        conf.allocated -= 1
        conf.idle.append(self)
        self._ctx._check_drained()  # a STOPPING context waits for its tasks to be freed

    # -- completion: the sink of the context's job ------------------------------------------------

    def _deliver(self, event: Event) -> None:
        # Called by Ctx._complete, anywhere; the callback waits for the engine's progress.
        err = event.error
        self._status = DocaErrorCode.SUCCESS if err is None else err.code
        self._error = err
        self._result = event.result
        self._ctx._held += 1
        pe = self._pe
        assert pe is not None
        pe._deferred.append(self._finish_cb)  # `ProgressEngine.defer`, inline
        if pe._armed:
            pe.notify()

    def _finish(self) -> None:
        self._state = TaskState.ALLOCATED
        conf = self._conf
        cb = conf.success_cb if self._status is DocaErrorCode.SUCCESS else conf.error_cb
        ctx = self._ctx
        try:
            cb(self, self._user_data, ctx._user_data)
        finally:
            self._completions += 1
            ctx._held -= 1  # `Ctx._release_held`, inline: only a STOPPING context has more to do
            if ctx._state is CtxState.STOPPING:
                ctx._check_drained()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._state.value} status={self._status.name}>"
