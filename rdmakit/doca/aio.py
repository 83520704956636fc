"""Awaiting DOCA jobs from trio, on the same `WorkQ`, contexts and jobs as the synchronous API.

::

    workq = WorkQ(depth, event_driven=True)
    rdma.workq_add(workq)
    event = await aio.run_job(workq, RdmaSendJob(ctx=rdma, src_buf=buf))

The WorkQ must be event-driven: waiting is ``trio.lowlevel.wait_readable`` on
its event handle, in the loop ``doca_workq_event_handle_arm`` describes
(retrieve until nothing is left, arm, wait, clear), never a busy loop. Any
number of tasks may wait on one WorkQ: one of them drives the handle at a
time, and every event it retrieves is handed to the task waiting for that
job. An event nobody waits for is kept until `wait_job` or `next_event`
takes it, so a cancelled wait loses nothing: the job stays in flight and its
event can still be awaited.

Tasks (DOCA 2.5+)::

    task = rdma.task_write_allocate_init(src, dst)
    await aio.run_task(task)           # submit, then wait until its callback ran
    await aio.progress(pe)             # doca_pe_progress, sleeping until there is progress

The engine is driven in the loop of ``doca_pe_request_notification``
(progress until nothing happens, request, ``wait_readable`` on the
notification handle, clear), one trio task at a time; the task's own
callbacks (``set_conf``) still run, inside ``progress``, before the await
returns.

Connecting by address (DOCA 2.7+): after ``rdma.connect_to_addr(addr)`` or
``rdma.start_listen_to_port(port)``, ``await aio.wait_connected(rdma)``
drives the engine until the connection is established (the connection
callbacks still run, inside progress) and raises if it failed. A context
with several connections awaits each: ``await aio.wait_connected(rdma,
conn)`` for the one `connect_to_addr` returned (or the request callback
got), ``await aio.wait_connections(rdma, n)`` until n are established (a
listener), ``await aio.wait_disconnected(conn)`` until one is closed.

Failed jobs are returned, not raised: check ``event.ok`` and ``event.error``
as with ``WorkQ.progress_retrieve``. Misuse (submitting to a stopped context,
a full WorkQ, ...) raises `DocaError` at once, as ``WorkQ.submit`` does.
"""

import weakref
from collections.abc import Callable, Sequence

import trio

from rdmakit.doca.ctx import CtxState, Event, Job
from rdmakit.doca.errors import DocaError, DocaErrorCode
from rdmakit.doca.pe import ProgressEngine
from rdmakit.doca.rdma import Rdma
from rdmakit.doca.rdma_conns import RdmaConnection
from rdmakit.doca.tasks import Task, TaskState
from rdmakit.doca.workq import WorkQ

__all__ = [
    "next_event",
    "progress",
    "run_job",
    "run_jobs",
    "run_task",
    "wait_connected",
    "wait_connections",
    "wait_disconnected",
    "wait_job",
    "wait_task",
]


class _Waiters:
    """Per-WorkQ state: retrieved events not yet claimed, and who drives the handle."""

    __slots__ = ("changed", "driving", "events", "wanted")

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.wanted: dict[int, int] = {}  # id(job) -> tasks in wait_job for it
        self.driving = False
        self.changed = trio.Event()

    def wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def take_job(self, job: Job) -> Event | None:
        for i, ev in enumerate(self.events):
            if ev.job is job:
                return self.events.pop(i)
        return None

    def take_any(self) -> Event | None:
        for i, ev in enumerate(self.events):
            if id(ev.job) not in self.wanted:
                return self.events.pop(i)
        return None


_by_workq: "weakref.WeakKeyDictionary[WorkQ, _Waiters]" = weakref.WeakKeyDictionary()


def _waiters(workq: WorkQ) -> _Waiters:
    if not workq.event_driven:
        raise DocaError(DocaErrorCode.BAD_STATE, "rdmakit.doca.aio needs WorkQ(..., event_driven=True)")
    st = _by_workq.get(workq)
    if st is None:
        st = _by_workq[workq] = _Waiters()
    return st


async def _wait(workq: WorkQ, take: Callable[[_Waiters], Event | None]) -> Event:
    st = _waiters(workq)
    await trio.lowlevel.checkpoint_if_cancelled()
    while True:
        ev = take(st)
        if ev is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return ev
        if st.driving:
            await st.changed.wait()
            continue
        st.driving = True
        try:
            got = False
            while (retrieved := workq.progress_retrieve()) is not None:
                st.events.append(retrieved)
                got = True
            if got:
                continue
            workq.arm()
            await trio.lowlevel.wait_readable(workq.fileno())
            workq.clear()
        finally:
            st.driving = False
            st.wake()


async def wait_job(workq: WorkQ, job: Job) -> Event:
    """Wait for the event of `job`, already submitted to `workq`."""
    st = _waiters(workq)
    key = id(job)
    st.wanted[key] = st.wanted.get(key, 0) + 1
    try:
        return await _wait(workq, lambda s: s.take_job(job))
    finally:
        left = st.wanted[key] - 1
        if left:
            st.wanted[key] = left
        else:
            del st.wanted[key]


async def run_job(workq: WorkQ, job: Job) -> Event:
    """Submit `job` to `workq` and wait for its event."""
    _waiters(workq)
    workq.submit(job)
    return await wait_job(workq, job)


async def run_jobs(workq: WorkQ, jobs: Sequence[Job]) -> list[Event]:
    """Submit every job, then wait for all their events; returned in the order of `jobs`.

    If a submission raises, the jobs already submitted are awaited first,
    then the error propagates.
    """
    _waiters(workq)
    submitted: list[Job] = []
    failure: DocaError | None = None
    for job in jobs:
        try:
            workq.submit(job)
        except DocaError as exc:
            failure = exc
            break
        submitted.append(job)
    events = [await wait_job(workq, job) for job in submitted]
    if failure is not None:
        raise failure
    return events


async def next_event(workq: WorkQ) -> Event:
    """The next event of `workq` that no `wait_job` is waiting for."""
    return await _wait(workq, _Waiters.take_any)


# -- the task API (DOCA 2.5+): await tasks and progress of a `ProgressEngine` ---------------------


class _Driver:
    """Per-engine state: whether a trio task is driving it, and who waits for a change."""

    __slots__ = ("changed", "driving")

    def __init__(self) -> None:
        self.driving = False
        self.changed = trio.Event()

    def wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


_by_pe: "weakref.WeakKeyDictionary[ProgressEngine, _Driver]" = weakref.WeakKeyDictionary()


def _driver(pe: ProgressEngine) -> _Driver:
    st = _by_pe.get(pe)
    if st is None:
        st = _by_pe[pe] = _Driver()
    return st


async def _drive_until(pe: ProgressEngine, done: Callable[[], bool]) -> None:
    """Progress `pe` (one trio task at a time) until `done()`, sleeping on its notification handle."""
    st = _driver(pe)
    await trio.lowlevel.checkpoint_if_cancelled()
    while not done():
        if st.driving:
            await st.changed.wait()
            continue
        st.driving = True
        try:
            if pe.progress():
                while pe.progress():
                    if done():
                        break
                continue
            pe.request_notification()
            await trio.lowlevel.wait_readable(pe.fileno())
            pe.clear_notification()
        finally:
            st.driving = False
            st.wake()
    await trio.lowlevel.cancel_shielded_checkpoint()


async def progress(pe: ProgressEngine) -> bool:
    """``doca_pe_progress`` that waits: True once `pe` made progress, sleeping on its handle until then.

    If another trio task is driving `pe`, its progress counts.
    """
    st = _driver(pe)
    await trio.lowlevel.checkpoint_if_cancelled()
    while True:
        if st.driving:
            await st.changed.wait()
            return True
        st.driving = True
        try:
            made = pe.progress()
            if not made:
                pe.request_notification()
                await trio.lowlevel.wait_readable(pe.fileno())
                pe.clear_notification()
        finally:
            st.driving = False
            st.wake()
        if made:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return True


async def wait_task(task: Task) -> Task:
    """Wait until `task`, submitted, has completed and its callback ran; returns it.

    Check ``task.get_status()``: a failed task is returned, not raised. The
    task's context must be connected to a progress engine.
    """
    pe = task.ctx.pe
    if pe is None:
        raise DocaError(DocaErrorCode.NOT_CONNECTED, "the task's context has no progress engine")
    seen = task._completions
    if task.state is not TaskState.SUBMITTED:
        raise DocaError(DocaErrorCode.BAD_STATE, f"{task!r} is not submitted")
    await _drive_until(pe, lambda: task._completions != seen)
    return task


def _engine(rdma: Rdma) -> ProgressEngine:
    pe = rdma.pe
    if pe is None:
        raise DocaError(DocaErrorCode.NOT_CONNECTED, "the context has no progress engine")
    return pe


def _established(rdma: Rdma) -> list[RdmaConnection]:
    return [c for c in rdma.connections if c.state == "established"]


async def wait_connected(rdma: Rdma, connection: RdmaConnection | None = None) -> RdmaConnection:
    """Progress `rdma`'s engine until its connection by address is established; returns it.

    After `Rdma.connect_to_addr`, or `Rdma.start_listen_to_port` on the
    passive side (the request callback still decides). Without `connection`,
    until the context is RUNNING (its first connection): a failure before
    (the failure callback ran) raises the context's error. With it, one of
    `rdma`'s connections, until that one is established; its failure or
    disconnect raises its error. The callbacks run, in progress, before this
    returns.
    """
    pe = _engine(rdma)
    if connection is not None:
        if connection.rdma is not rdma:
            raise DocaError(DocaErrorCode.INVALID_VALUE, f"{connection!r} is not a connection of {rdma!r}")
        await _drive_until(pe, lambda: connection.state in ("established", "closed"))
        if connection.state != "established":
            raise connection.error or DocaError(DocaErrorCode.NOT_CONNECTED, f"{connection!r} is closed")
        return connection

    def settled() -> bool:
        return rdma.state is not CtxState.STARTING or rdma.error is not None

    await _drive_until(pe, settled)
    up = _established(rdma)
    if rdma.state is not CtxState.RUNNING or not up:
        raise rdma.error or DocaError(DocaErrorCode.NOT_CONNECTED, f"the context is {rdma.state.name}")
    return up[0]


async def wait_connections(rdma: Rdma, count: int) -> tuple[RdmaConnection, ...]:
    """Progress `rdma`'s engine until `count` of its connections are established; returns them.

    For a listener of ``max_num_connections`` >= `count` (the request
    callback still accepts or rejects each); BAD_STATE if the context stops
    meanwhile, INVALID_VALUE for a `count` it can never hold.
    """
    if type(count) is not int or not 1 <= count <= rdma.max_num_connections:
        raise DocaError(
            DocaErrorCode.INVALID_VALUE,
            f"count {count!r} is not in [1, max_num_connections {rdma.max_num_connections}]",
        )
    pe = _engine(rdma)

    def settled() -> bool:
        live = rdma.state in (CtxState.STARTING, CtxState.RUNNING)
        return not live or len(_established(rdma)) >= count

    await _drive_until(pe, settled)
    up = _established(rdma)
    if len(up) < count:
        raise DocaError(DocaErrorCode.BAD_STATE, f"the context is {rdma.state.name}")
    return tuple(up)


async def wait_disconnected(connection: RdmaConnection) -> DocaError | None:
    """Progress its context's engine until `connection` is closed (its disconnect callback ran).

    Returns the connection's error (why it closed), None if it had none.
    """
    ctx = connection.rdma
    pe = ctx.pe
    if pe is None:
        raise DocaError(DocaErrorCode.NOT_CONNECTED, "the context has no progress engine")
    await _drive_until(pe, lambda: connection.state == "closed")
    return connection.error


async def run_task(task: Task) -> Task:
    """Submit `task` and wait for its completion (`wait_task`)."""
    task.submit()
    return await wait_task(task)
