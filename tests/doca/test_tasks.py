"""DOCA tasks and the progress engine.

DOCA 2.5+: ``doca_pe.h``, ``doca_ctx.h``, ``doca_rdma.h``, ``doca_dma.h``.

Each test names the header text or DOCA sample it follows. RDMA tasks run on
two soft devices (`task_harness.Duo`, task API); DMA tasks on a local device.
"""

import select
from collections.abc import Callable, Iterator

import pytest

from rdmakit.doca import (
    PE,
    AccessFlag,
    Buf,
    BufInventory,
    CtxState,
    Dev,
    Dma,
    DmaTaskMemcpy,
    DocaErrorCode,
    ProgressEngine,
    RdmaOpcode,
    RdmaTaskReceive,
    RdmaTaskSend,
    RdmaTaskWrite,
    Task,
    TaskState,
    WorkQ,
)
from tests.doca.task_harness import RW, Duo
from tests.doca.util import MmapFactory, error_code


@pytest.fixture(params=["udp", "tcp"])
def duo(request: pytest.FixtureRequest, new_ip: Callable[[], str]) -> Iterator[Duo]:
    """A connected requester/responder pair on the task API, over soft UDP and soft TCP."""
    d = Duo("task", request.param, new_ip, num_tasks=4)
    try:
        yield d.up()
    finally:
        d.close()


def _send_recv_bufs(d: Duo, msg: bytes = b"hello tasks") -> tuple[Buf, Buf, bytearray]:
    ma, _ = d.a.mmap(msg)
    mb, mem_b = d.b.mmap(64)
    return d.a.data(ma, 0, len(msg)), d.b.room(mb, 0, 64), mem_b


def _progress_until(on: "ProgressEngine | Duo", done: Callable[[], bool], limit: int = 200_000) -> None:
    """Progress until `done`, sleeping on the notification handle when idle (a Duo notes callbacks)."""
    pe = on.pe if isinstance(on, Duo) else on
    step = on.progress
    for _ in range(limit):
        if done():
            return
        if not step():
            pe.request_notification()
            select.select([pe.fileno()], [], [], 0.5)
            pe.clear_notification()
    pytest.fail("the engine never finished")


# -- the progress engine and callbacks ----------------------------------------------------------


def test_pe_is_the_progress_engine() -> None:
    """doca_pe.h: doca_pe_create; progress returns whether anything happened (0 when idle)."""
    assert PE is ProgressEngine
    with PE() as pe:
        assert pe.progress() is False
        assert pe.num_inflight_tasks == pe.get_num_inflight_tasks() == 0


def test_callbacks_run_only_inside_progress(duo: Duo) -> None:
    """doca_pe.h doca_task_completion_cb_t: "called by doca_pe_progress()"; never from submit."""
    src, dst, mem_b = _send_recv_bufs(duo)
    recv = duo.b.rdma.task_receive_allocate_init(dst, user_data="r")
    send = duo.a.rdma.task_send_allocate_init(src, user_data="s")
    recv.submit()
    send.submit()
    assert duo.done == []
    assert duo.pe.num_inflight_tasks == 2
    _progress_until(duo, lambda: len(duo.done) == 2)
    assert duo.in_callback == [True, True]
    assert {t.get_user_data() for t in duo.done} == {"r", "s"}
    assert recv.get_status() is DocaErrorCode.SUCCESS
    assert recv.get_result_opcode() is RdmaOpcode.RECV_SEND
    assert recv.get_result_len() == 11
    assert recv.get_result_rdma_connection() is duo.b.rdma
    assert bytes(mem_b[:11]) == b"hello tasks"
    assert duo.pe.num_inflight_tasks == 0


def test_a_completion_during_submit_waits_for_progress(duo: Duo) -> None:
    """doca_pe.h: callbacks are nested in doca_pe_progress only, even for a task that fails at once.

    A connection in ERROR (IBTA §10.3.1) flushes a posted request immediately;
    its error callback still runs in the next progress.
    """
    ma, _ = duo.a.mmap(b"x" * 8)
    mb, _ = duo.b.mmap(8, RW | AccessFlag.RDMA_READ)  # no RDMA_WRITE: the write is refused
    remote = duo.share(mb)
    bad = duo.a.rdma.task_write_allocate_init(duo.a.data(ma, 0, 8), duo.a.room(remote, 0, 8))
    bad.submit()
    _progress_until(duo, lambda: len(duo.done) == 1)
    assert bad.get_status() is DocaErrorCode.NOT_PERMITTED
    assert bad.error is not None
    assert "RDMA_WRITE" in bad.error.message
    again = duo.a.rdma.task_send_allocate_init(duo.a.data(ma, 0, 8))
    again.submit()  # the connection is in ERROR: flushed inside submit
    assert len(duo.done) == 1  # but not called back here
    assert duo.progress() is True
    assert duo.done[-1] is again
    assert duo.in_callback[-1] is True
    assert again.get_status() is not DocaErrorCode.SUCCESS


def test_pool_exhaustion_and_free(duo: Duo) -> None:
    """doca_rdma.h *_allocate_init: NO_MEMORY "no more tasks to allocate"; doca_task_free refills."""
    src, _, _ = _send_recv_bufs(duo)
    tasks = [duo.a.rdma.task_send_allocate_init(src) for _ in range(4)]
    assert error_code(lambda: duo.a.rdma.task_send_allocate_init(src)) is DocaErrorCode.NO_MEMORY
    other = duo.a.rdma.task_write_alloc_init  # pools are per task type
    mb, _ = duo.b.mmap(8, RW | AccessFlag.RDMA_WRITE)
    other(src, duo.a.room(duo.share(mb), 0, 8)).free()
    tasks[0].free()
    assert tasks[0].state is TaskState.FREED
    assert error_code(tasks[0].free) is DocaErrorCode.BAD_STATE
    assert error_code(tasks[0].submit) is DocaErrorCode.BAD_STATE
    duo.a.rdma.task_send_allocate_init(src)  # room again
    assert error_code(lambda: duo.a.rdma.task_send_allocate_init(src)) is DocaErrorCode.NO_MEMORY


def test_unconfigured_type_and_states(new_ip: Callable[[], str]) -> None:
    """doca_ctx.h: configuration in IDLE only (BAD_STATE); tasks allocated and submitted in RUNNING."""
    d = Duo("task", "udp", new_ip)
    try:
        rdma = d.a.rdma
        ma, _ = d.a.mmap(8)
        src = d.a.data(ma, 0, 8)
        assert error_code(lambda: rdma.task_send_allocate_init(src)) is DocaErrorCode.BAD_STATE  # IDLE
        assert (
            error_code(lambda: rdma.task_send_set_conf(d._on_task, d._on_task, 0))
            is DocaErrorCode.INVALID_VALUE
        )
        d.up()
        assert (
            error_code(lambda: rdma.task_send_set_conf(d._on_task, d._on_task, 4)) is DocaErrorCode.BAD_STATE
        )
        dma = Dma(d.a.dev)
        d.pe.connect_ctx(dma)
        dma.start()
        dst = d.a.room(d.a.mmap(8)[0], 0, 8)
        assert (
            error_code(lambda: dma.task_memcpy_alloc_init(src, dst)) is DocaErrorCode.NO_MEMORY
        )  # never set
        dma.close()
    finally:
        d.close()


def test_submit_twice_and_free_while_submitted(duo: Duo) -> None:
    """doca_pe.h doca_task_submit: DOCA owns a submitted task; doca_task_free only when not submitted."""
    _, dst, _ = _send_recv_bufs(duo)
    recv = duo.b.rdma.task_receive_allocate_init(dst)
    recv.submit()
    assert error_code(recv.submit) is DocaErrorCode.IN_USE
    assert error_code(recv.free) is DocaErrorCode.IN_USE
    assert recv.state is TaskState.SUBMITTED


def test_free_and_resubmit_inside_callbacks(new_ip: Callable[[], str]) -> None:
    """doca_pe.h doca_task_completion_cb_t: inside the callback re-submit the task or doca_task_free it."""
    d = Duo("task", "udp", new_ip, num_tasks=1)
    seen: list[str] = []
    try:
        sends = {"left": 3}

        def sent(task: RdmaTaskSend, task_user_data: object, ctx_user_data: object) -> None:
            seen.append(f"sent {sends['left']}")
            sends["left"] -= 1
            if sends["left"]:
                task.submit()  # the same task object, again
            else:
                task.free()

        def received(task: RdmaTaskReceive, task_user_data: object, ctx_user_data: object) -> None:
            buf = task.get_dst_buf()
            assert buf is not None
            seen.append(f"recv {task.get_result_len()}")
            buf.set_data(buf.addr, 0)
            task.submit()

        d.a.rdma.task_send_set_conf(sent, sent, 1)
        d.b.rdma.task_receive_set_conf(received, received, 1)
        d.up()
        src, dst, _ = _send_recv_bufs(d, b"abc")
        recv = d.b.rdma.task_receive_allocate_init(dst)
        recv.submit()
        send = d.a.rdma.task_send_allocate_init(src)
        send.submit()
        _progress_until(d, lambda: sends["left"] == 0 and seen.count("recv 3") == 3)
        assert send.state is TaskState.FREED
        d.a.rdma.task_send_allocate_init(src).free()  # its pool slot came back
        assert recv.state is TaskState.SUBMITTED
    finally:
        d.close()


def test_state_callback_order_and_async_stop(new_ip: Callable[[], str]) -> None:
    """doca_ctx.h state machine and doca_ctx_stop (pe_async_stop_sample.c): tasks in flight are flushed.

    stop with tasks in flight: STOPPING; each flushed task's error callback
    runs in progress with status SHUTDOWN; then STOPPING -> IDLE, reported to
    doca_ctx_state_changed_cb(user_data, ctx, prev, next).
    """
    d = Duo("task", "tcp", new_ip, num_tasks=4)
    log: list[object] = []
    try:
        rdma = d.b.rdma
        rdma.set_user_data("ctx-b")

        def on_state(user_data: object, ctx: object, prev: CtxState, nxt: CtxState) -> None:
            assert ctx is rdma
            log.append((user_data, prev.name, nxt.name))

        def on_error(task: RdmaTaskReceive, task_user_data: object, ctx_user_data: object) -> None:
            log.append(("flushed", task_user_data, task.get_status().name, ctx_user_data, rdma.state.name))
            task.free()

        rdma.set_state_changed_cb(on_state)
        rdma.task_receive_set_conf(d._on_task, on_error, 4)
        d.up()
        mb, _ = d.b.mmap(64)
        for i in range(3):
            rdma.task_receive_allocate_init(d.b.room(mb, i * 8, 8), user_data=i).submit()
        assert rdma.num_inflight == 3
        rdma.stop()  # doca_ctx_stop returns IN_PROGRESS in C: tasks are in flight
        assert rdma.state is CtxState.STOPPING
        assert not any(e[0] == "flushed" for e in log if isinstance(e, tuple))
        _progress_until(d, lambda: rdma.state is CtxState.IDLE)
        assert log == [
            ("ctx-b", "IDLE", "STARTING"),
            ("ctx-b", "STARTING", "RUNNING"),
            ("ctx-b", "RUNNING", "STOPPING"),
            ("flushed", 0, "SHUTDOWN", "ctx-b", "STOPPING"),
            ("flushed", 1, "SHUTDOWN", "ctx-b", "STOPPING"),
            ("flushed", 2, "SHUTDOWN", "ctx-b", "STOPPING"),
            ("ctx-b", "STOPPING", "IDLE"),
        ]
        assert d.pe.num_inflight_tasks == 0
    finally:
        d.close()


def test_stop_without_tasks_is_synchronous(new_ip: Callable[[], str]) -> None:
    """doca_ctx.h: with nothing in flight doca_ctx_stop reaches IDLE at once (DOCA_SUCCESS)."""
    d = Duo("task", "udp", new_ip)
    try:
        d.up()
        d.a.rdma.stop()
        assert d.a.rdma.state is CtxState.IDLE
    finally:
        d.close()


def test_notification_handle_wakes_for_a_completion(duo: Duo) -> None:
    """doca_pe.h doca_pe_request_notification flow: arm, epoll/select, clear, progress until 0.

    Every wait is a select on the notification handle that must come back
    readable (never its timeout): the loop sleeps until there is work.
    """
    src, dst, mem_b = _send_recv_bufs(duo)
    duo.b.rdma.task_receive_allocate_init(dst).submit()
    duo.a.rdma.task_send_allocate_init(src).submit()
    fd = duo.pe.fileno()
    waits = 0
    while len(duo.done) < 2:
        while duo.progress():
            pass
        if len(duo.done) == 2:
            break
        duo.pe.request_notification()
        ready, _, _ = select.select([fd], [], [], 10.0)
        assert ready == [fd], "the notification handle did not wake for the completion"
        duo.pe.clear_notification()
        waits += 1
    assert bytes(mem_b[:11]) == b"hello tasks"


def test_handle_is_readable_when_a_stop_queued_callbacks(duo: Duo) -> None:
    """doca_pe.h + doca_ctx.h: completions queued outside progress (the stop flush) wake an armed handle."""
    _, dst, _ = _send_recv_bufs(duo)
    duo.b.rdma.task_receive_allocate_init(dst).submit()
    while duo.progress():
        pass
    duo.b.rdma.stop()
    duo.pe.request_notification()
    ready, _, _ = select.select([duo.pe.fileno()], [], [], 10.0)
    assert ready
    duo.pe.clear_notification()
    assert duo.progress() is True
    assert duo.done
    assert duo.done[0].get_status() is DocaErrorCode.SHUTDOWN


def test_task_getters_setters_and_user_data(duo: Duo) -> None:
    """doca_rdma.h doca_rdma_task_write_{get,set}_{src,dst}_buf, doca_task_{get,set}_user_data."""
    mb, mem_b = duo.b.mmap(32, RW | AccessFlag.RDMA_WRITE)
    remote = duo.share(mb)
    ma, _ = duo.a.mmap(b"firstsecond")
    first, second = duo.a.data(ma, 0, 5), duo.a.data(ma, 5, 6)
    dst = duo.a.room(remote, 0, 32)
    task = duo.a.rdma.task_write_allocate_init(first, dst, user_data=1)
    assert (task.get_src_buf(), task.get_dst_buf(), task.get_user_data()) == (first, dst, 1)
    assert task.as_task() is task
    assert task.get_ctx() is duo.a.rdma
    task.submit()
    _progress_until(duo, lambda: len(duo.done) == 1)
    task.set_src_buf(second)
    task.set_user_data(2)
    task.submit()
    _progress_until(duo, lambda: len(duo.done) == 2)
    assert [t.get_user_data() for t in duo.done] == [2, 2]  # the same task, twice
    assert bytes(mem_b[:11]) == b"firstsecond"
    assert isinstance(task, RdmaTaskWrite)


# -- DMA and one engine for several contexts --------------------------------------------------


def test_dma_memcpy_task(dev: Dev, make_mmap: MmapFactory) -> None:
    """doca_dma.h doca_dma_task_memcpy_set_conf / _alloc_init / get_src, get_dst (DMA local copy sample)."""
    pe = dev.pe
    inv = BufInventory(8)
    inv.start()
    src_m = make_mmap(bytearray(b"copy me, please"))
    dst_mem = bytearray(32)
    dst_m = make_mmap(dst_mem)
    done: list[DmaTaskMemcpy] = []
    with Dma(dev) as dma:
        pe.connect_ctx(dma)
        dma.task_memcpy_set_conf(lambda t, u, c: done.append(t), lambda t, u, c: done.append(t), 2)
        dma.start()
        src = inv.get_by_data(src_m, src_m.addr, 15)
        dst = inv.get_by_addr(dst_m, dst_m.addr, 32)
        task = dma.task_memcpy_alloc_init(src, dst, user_data="copy")
        assert (task.get_src(), task.get_dst()) == (src, dst)
        task.submit()
        assert done == []
        _progress_until(pe, lambda: bool(done))
        assert task.get_status() is DocaErrorCode.SUCCESS
        assert task.get_result_len() == 15
        assert dst.data_len == 15
        assert bytes(dst_mem[:15]) == b"copy me, please"
        task.free()


def test_one_pe_drives_rdma_and_dma_of_several_devices(new_ip: Callable[[], str]) -> None:
    """doca_pe.h: "The progress engine is associated with one or more doca contexts" of any library."""
    d = Duo("task", "udp", new_ip)
    try:
        dma_done: list[Task] = []
        dma = Dma(d.b.dev)
        d.pe.connect_ctx(dma)
        dma.task_memcpy_set_conf(lambda t, u, c: dma_done.append(t), lambda t, u, c: dma_done.append(t), 4)
        with WorkQ(4, pe=d.pe) as wq:
            assert error_code(lambda: dma.workq_add(wq)) is DocaErrorCode.IN_USE  # one engine per context
        dma.start()
        d.up()
        src, dst, mem_b = _send_recv_bufs(d)
        d.b.rdma.task_receive_allocate_init(dst).submit()
        d.a.rdma.task_send_allocate_init(src).submit()
        mb, _mem2 = d.b.mmap(b"local copy")
        mc, mem3 = d.b.mmap(16)
        dma.task_memcpy_alloc_init(d.b.data(mb, 0, 10), d.b.room(mc, 0, 16)).submit()
        assert d.pe.num_inflight_tasks == 3
        _progress_until(d, lambda: len(d.done) == 2 and len(dma_done) == 1)
        assert bytes(mem_b[:11]) == b"hello tasks"
        assert bytes(mem3[:10]) == b"local copy"
        dma.close()
    finally:
        d.close()


def test_connect_twice_is_refused(new_ip: Callable[[], str]) -> None:
    """doca_pe.h doca_pe_create: "A doca context can only be associated with one progress engine";
    doca_pe_connect_ctx: "DOCA_ERROR_NOT_PERMITTED - context is already connected to a progress engine"."""
    d = Duo("task", "udp", new_ip)
    try:
        with PE() as other:
            assert error_code(lambda: d.pe.connect_ctx(d.a.rdma)) is DocaErrorCode.NOT_PERMITTED
            assert error_code(lambda: other.connect_ctx(d.a.rdma)) is DocaErrorCode.NOT_PERMITTED
    finally:
        d.close()
