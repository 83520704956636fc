"""``doca_ctx.h``: the context lifecycle, as DOCA 2.5+ runs it on a progress engine, and the DOCA 2.0
job API's stop rule where it differs."""

from rdmakit.doca import CtxState, DocaErrorCode, Rdma, Task
from tests.doca.fidelity.conftest import DuoFactory
from tests.doca.util import error_code


def test_start_of_an_asynchronous_context_is_in_progress(make_duo: DuoFactory) -> None:
    """doca_ctx_start: "Asynchronous: Change state to started and return DOCA_ERROR_IN_PROGRESS"."""
    d = make_duo("task")
    assert d.a.rdma.start() is DocaErrorCode.IN_PROGRESS
    assert d.a.rdma.state is CtxState.STARTING


def test_stop_with_tasks_in_flight(make_duo: DuoFactory) -> None:
    """doca_ctx_stop: "DOCA_ERROR_IN_PROGRESS - some tasks are still in progress. CTX will move to
    stopping state and a state changed callback shall be invoked when context is fully stopped";
    DOCA_CTX_STATE_STOPPING: "Submitted tasks are flushed or drained (during progress call)"."""
    d = make_duo("task").up()
    seen: list[tuple[CtxState, CtxState, bool]] = []
    rdma = d.b.rdma
    rdma.set_state_changed_cb(lambda _ud, _c, prev, nxt: seen.append((prev, nxt, d.pe.in_progress)))
    mb, _ = d.b.mmap(32)
    tasks = [rdma.task_receive_allocate_init(d.b.room(mb, i * 8, 8)) for i in range(3)]
    for t in tasks:
        t.submit()
    assert rdma.stop() is DocaErrorCode.IN_PROGRESS
    assert rdma.state is CtxState.STOPPING
    assert not any(t in d.done for t in tasks)  # callbacks wait for progress
    d._until(lambda: all(any(t is x for x in d.done) for t in tasks), lambda: "the flushed tasks")
    assert all(t.get_status() is DocaErrorCode.SHUTDOWN for t in tasks)
    assert all(d.in_callback)
    assert rdma.state is CtxState.STOPPING  # the tasks are not freed yet
    for t in tasks:
        t.free()
    d._until(lambda: rdma.state is CtxState.IDLE, lambda: "IDLE")
    assert seen == [(CtxState.RUNNING, CtxState.STOPPING, False), (CtxState.STOPPING, CtxState.IDLE, True)]


def test_stop_with_nothing_in_flight_is_synchronous(make_duo: DuoFactory) -> None:
    """doca_ctx_stop: "DOCA_SUCCESS - In case of success" when nothing is in flight: IDLE on return."""
    d = make_duo("task").up()
    assert d.a.rdma.stop() is DocaErrorCode.SUCCESS
    assert d.a.rdma.state is CtxState.IDLE


def test_job_api_stop_needs_the_workq_removed(make_duo: DuoFactory) -> None:
    """DOCA 2.0 doca_ctx_stop: "DOCA_ERROR_NOT_PERMITTED - either some jobs are still pending or not
    all WorkQs have been removed"; doca_ctx_workq_rm then stop goes through."""
    d = make_duo("job").up()
    rdma, wq = d.a.rdma, d.a.wq
    assert wq is not None
    assert error_code(rdma.stop) is DocaErrorCode.NOT_PERMITTED
    assert rdma.state is CtxState.RUNNING
    rdma.workq_rm(wq)
    assert rdma.stop() is DocaErrorCode.SUCCESS


def test_start_without_a_progress_engine_is_not_connected(make_duo: DuoFactory) -> None:
    """doca_ctx_start: "DOCA_ERROR_NOT_CONNECTED - ctx is not connected to a PE"."""
    d = make_duo("task")
    with Rdma(d.a.dev) as rdma:

        def cb(task: Task, task_ud: object, ctx_ud: object) -> None: ...

        rdma.task_send_set_conf(cb, cb, 4)
        assert error_code(rdma.start) is DocaErrorCode.NOT_CONNECTED
        assert rdma.state is CtxState.IDLE
