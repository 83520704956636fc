"""``doca_pe.h``: the progress engine, task ownership and what may run inside progress."""

import pytest

from rdmakit.doca import PE, CtxState, DocaError, DocaErrorCode, Task
from tests.doca.fidelity.conftest import DuoFactory
from tests.doca.util import error_code


def test_connect_ctx_twice_is_not_permitted(make_duo: DuoFactory) -> None:
    """doca_pe_connect_ctx: "DOCA_ERROR_NOT_PERMITTED - context is already connected to a progress
    engine", this one or another."""
    d = make_duo("task")
    with PE() as other:
        assert error_code(lambda: d.pe.connect_ctx(d.a.rdma)) is DocaErrorCode.NOT_PERMITTED
        assert error_code(lambda: other.connect_ctx(d.a.rdma)) is DocaErrorCode.NOT_PERMITTED


def test_tasks_must_be_freed_for_the_context_to_stop(make_duo: DuoFactory) -> None:
    """doca_task_free: "All tasks MUST be freed in order for a context to be stopped"; the context
    moves to IDLE inside progress ("Context state transition (starting -> running or stopping -> idle)"
    is progress, doca_pe_progress)."""
    d = make_duo("task").up()
    rdma = d.a.rdma
    ma, _ = d.a.mmap(b"kept")
    kept = rdma.task_send_allocate_init(d.a.data(ma, 0, 4))  # allocated, never submitted
    assert rdma.stop() is DocaErrorCode.IN_PROGRESS
    for _ in range(3):
        d.progress()
    assert rdma.state is CtxState.STOPPING
    kept.free()
    assert rdma.state is CtxState.STOPPING  # IDLE comes from progress, not from free()
    d.progress()
    assert rdma.state is CtxState.IDLE  # type: ignore[comparison-overlap]  # progress changed it


def test_progress_inside_a_callback_is_refused(make_duo: DuoFactory) -> None:
    """doca_task_completion_cb_t: "Inside this callback the user shouldn't call doca_pe_progress()"."""
    d = make_duo("task").up()
    errors: list[DocaErrorCode] = []

    def nested(task: Task, task_ud: object, ctx_ud: object) -> None:
        try:
            d.pe.progress()
        except DocaError as e:
            errors.append(e.code)
        task.free()

    rdma = d.a.rdma
    rdma.stop()
    rdma.task_send_set_conf(nested, nested, 1)
    d.b.rdma.stop()
    d.up()
    mb, _ = d.b.mmap(8)
    d.b.rdma.task_receive_allocate_init(d.b.room(mb, 0, 8)).submit()
    ma, _ = d.a.mmap(b"x")
    rdma.task_send_allocate_init(d.a.data(ma, 0, 1)).submit()
    d._until(lambda: bool(errors), lambda: "the send's callback")
    assert errors == [DocaErrorCode.BAD_STATE]


def test_num_inflight_tasks_counts_until_the_callback(make_duo: DuoFactory) -> None:
    """doca_pe_get_num_inflight_tasks: "the number of in flight tasks in a progress engine"; a
    completed task is in flight until its callback ran (doca_task_completion_cb_t hands it back)."""
    d = make_duo("task").up()
    mb, _ = d.b.mmap(8)
    recv = d.b.rdma.task_receive_allocate_init(d.b.room(mb, 0, 8))
    recv.submit()
    assert d.pe.num_inflight_tasks == 1
    ma, _ = d.a.mmap(b"y")
    send = d.a.rdma.task_send_allocate_init(d.a.data(ma, 0, 1))
    send.submit()
    d._until(lambda: any(t is recv for t in d.done), lambda: "the receive")
    d._until(lambda: any(t is send for t in d.done), lambda: "the send")
    assert d.pe.num_inflight_tasks == 0


def test_destroy_is_in_use_while_contexts_are_connected(make_duo: DuoFactory) -> None:
    """doca_pe_destroy: "DOCA_ERROR_IN_USE - contexts are still connected to the progress engine"."""
    d = make_duo("task")
    with pytest.raises(DocaError) as refused:
        d.pe.close()
    assert refused.value.code is DocaErrorCode.IN_USE
    assert "Rdma" in str(refused.value)
    assert not d.pe.closed
