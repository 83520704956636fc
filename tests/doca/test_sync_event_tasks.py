"""Sync event tasks (DOCA 2.5+ ``doca_sync_event.h``) and RDMA remote net sync event tasks (``doca_rdma.h``).

Local tasks run on a `SyncEvent` connected to a `PE`. The remote tasks run on
two soft devices (`task_harness.Duo`): side ``b`` owns the event and exports
it, side ``a`` imports it and reads, sets and adds to it over RDMA.
"""

import functools
import mmap
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rdmakit.doca import (
    PE,
    U64_MAX,
    CtxState,
    Dev,
    DocaError,
    DocaErrorCode,
    Mmap,
    RdmaTaskRemoteNetSyncEventGet,
    RdmaTaskRemoteNetSyncEventNotifyAdd,
    RdmaTaskRemoteNetSyncEventNotifySet,
    SyncEvent,
    SyncEventRemoteNet,
    SyncEventTaskGet,
    SyncEventTaskNotifyAdd,
    SyncEventTaskNotifySet,
    SyncEventTaskWaitGt,
    Task,
)
from tests.doca.task_harness import Duo
from tests.doca.util import error_code


class Local:
    """A started sync event on its own engine, every task type configured with `num_tasks`."""

    def __init__(self, num_tasks: int = 4) -> None:
        self.pe = PE()
        self.event = SyncEvent()
        self.done: list[Task] = []
        self.inside: list[bool] = []
        self._progressing = False
        self.pe.connect_ctx(self.event)
        for kind in ("get", "notify_set", "notify_add", "wait_gt"):
            getattr(self.event, f"task_{kind}_set_conf")(self._cb, self._cb, num_tasks)
        self.event.start()

    def _cb(self, task: Task, task_user_data: object, ctx_user_data: object) -> None:
        self.inside.append(self._progressing)
        self.done.append(task)

    def progress(self) -> bool:
        self._progressing = True
        try:
            return self.pe.progress()
        finally:
            self._progressing = False

    def run(self, task: Task) -> Task:
        task.submit()
        for _ in range(1000):
            if task in self.done:
                self.done.remove(task)
                return task
            self.progress()
        pytest.fail(f"{task} never completed")

    def close(self) -> None:
        self.event.close()
        self.pe.close()


@pytest.fixture
def local() -> Iterator[Local]:
    lo = Local()
    try:
        yield lo
    finally:
        lo.close()


def test_get_set_add_tasks(local: Local) -> None:
    """doca_sync_event_task_{notify_set,notify_add,get}: set, add (the value before), read."""
    ev = local.event
    t_set = local.run(ev.task_notify_set_alloc_init(U64_MAX - 1, user_data="s"))
    assert isinstance(t_set, SyncEventTaskNotifySet)
    assert t_set.get_status() is DocaErrorCode.SUCCESS
    assert t_set.get_set_val() == U64_MAX - 1
    assert t_set.get_user_data() == "s"
    t_add = local.run(ev.task_notify_add_alloc_init(3))
    assert isinstance(t_add, SyncEventTaskNotifyAdd)
    assert t_add.get_fetched_val() == U64_MAX - 1  # fetched_val_ptr: the value before the add
    t_get = local.run(ev.task_get_alloc_init())
    assert isinstance(t_get, SyncEventTaskGet)
    assert t_get.get_ret_val() == 1
    assert local.inside == [True, True, True]  # callbacks only inside doca_pe_progress
    t_set.set_set_val(7)  # a setter, then the same task again
    local.run(t_set)
    assert ev.get() == 7
    for t in (t_set, t_add, t_get):
        t.free()


def test_wait_gt_task_completes_on_a_later_update(local: Local) -> None:
    """doca_sync_event_task_wait_gt: completes once value & mask > wait_val, not before."""
    ev = local.event
    wait = ev.task_wait_gt_alloc_init(0x10, mask=0xFF)
    assert isinstance(wait, SyncEventTaskWaitGt)
    assert (wait.get_wait_val(), wait.get_mask()) == (0x10, 0xFF)
    wait.submit()
    ev.update_set(0x110)  # masked: 0x10, not greater
    for _ in range(10):
        local.progress()
    assert wait not in local.done
    assert wait.get_ret_val() is None
    local.run(ev.task_notify_add_alloc_init(1))
    for _ in range(10):
        local.progress()
    assert wait in local.done
    assert wait.get_ret_val() == 0x111


def test_pool_exhaustion_and_u64_checks(local: Local) -> None:
    """doca_sync_event_task_*_alloc_init: NO_MEMORY past num_tasks; values are uint64_t."""
    ev = local.event
    tasks = [ev.task_get_alloc_init() for _ in range(4)]
    assert error_code(ev.task_get_alloc_init) is DocaErrorCode.NO_MEMORY
    tasks.pop().free()
    ev.task_get_alloc_init().free()
    bad: Any
    for bad in (-1, 1 << 64, 1.0):
        for alloc in (
            ev.task_notify_set_alloc_init,
            ev.task_notify_add_alloc_init,
            ev.task_wait_gt_alloc_init,
        ):
            assert error_code(functools.partial(alloc, bad)) is DocaErrorCode.INVALID_VALUE
        assert (
            error_code(functools.partial(ev.task_wait_gt_alloc_init, 0, bad)) is DocaErrorCode.INVALID_VALUE
        )
    # the refused allocations took nothing from the pools
    more = [ev.task_notify_set_alloc_init(0) for _ in range(4)]
    for t in tasks + more:
        t.free()


def test_stop_flushes_a_pending_wait_with_shutdown(local: Local) -> None:
    """doca_ctx_stop with a wait in flight: IN_PROGRESS; its error callback runs in progress
    (SHUTDOWN); IDLE only once the task is freed (``doca_pe.h``, doca_task_free: "All tasks MUST be
    freed in order for a context to be stopped"), inside progress."""
    ev = local.event
    wait = ev.task_wait_gt_alloc_init(5)
    wait.submit()
    assert ev.stop() is DocaErrorCode.IN_PROGRESS
    assert wait not in local.done
    for _ in range(10):
        local.progress()
    assert local.done == [wait]
    assert local.inside == [True]
    assert wait.get_status() is DocaErrorCode.SHUTDOWN
    assert ev.state is CtxState.STOPPING
    wait.free()
    assert ev.state is CtxState.STOPPING  # IDLE in progress only
    local.progress()
    assert ev.state is CtxState.IDLE  # type: ignore[comparison-overlap]  # progress changed it


# -- the remote net sync event -------------------------------------------------------------------


def remote_duo(transport: str, new_ip: Callable[[], str]) -> Duo:
    """A connected pair whose side a has the remote net sync event tasks configured."""
    d = Duo("task", transport, new_ip, num_tasks=4)
    cb = d._on_task
    for kind in ("get", "notify_set", "notify_add"):
        getattr(d.a.rdma, f"task_remote_net_sync_event_{kind}_set_conf")(cb, cb, 4)
    return d.up()


@pytest.fixture(params=["udp", "tcp"])
def duo(request: pytest.FixtureRequest, new_ip: Callable[[], str]) -> Iterator[Duo]:
    d = remote_duo(request.param, new_ip)
    try:
        yield d
    finally:
        d.close()


def _owned_event(d: Duo, *, remote: bool = True) -> SyncEvent:
    """Side b's sync event, published to over the network."""
    event = SyncEvent()
    event.add_subscriber_location_cpu(d.b.dev)
    if remote:
        event.add_publisher_location_remote_net()
    d.pe.connect_ctx(event)
    event.task_wait_gt_set_conf(d._on_task, d._on_task, 2)
    event.start()
    return event


def _word(value: int) -> bytes:
    return value.to_bytes(8, sys.byteorder)


def _run(d: Duo, task: Task) -> Task:
    task.submit()
    d._until(lambda: task in d.done, lambda: repr(task))
    d.done.remove(task)
    return task


def remote_tasks_scenario(d: Duo) -> None:
    """doca_rdma_task_remote_net_sync_event_{get,notify_set,notify_add} on an exported event.

    `d` comes from `remote_duo`; side b owns the event. Also run on verbs in the lab.
    """
    event = _owned_event(d)
    try:
        event.update_set(40)
        remote = SyncEventRemoteNet.create_from_export(d.a.dev, event.export_to_remote_net())
        rdma = d.a.rdma
        m, mem = d.a.mmap(32)

        get = rdma.task_remote_net_sync_event_get_allocate_init(remote, d.a.room(m, 0, 8))
        assert isinstance(get, RdmaTaskRemoteNetSyncEventGet)
        assert get.get_sync_event() is remote
        _run(d, get)
        assert get.get_status() is DocaErrorCode.SUCCESS
        assert get.get_result_len() == 8
        assert bytes(mem[0:8]) == _word(40)

        mem[8:16] = _word(U64_MAX - 1)
        put = rdma.task_remote_net_sync_event_notify_set_allocate_init(remote, d.a.data(m, 8, 8))
        assert isinstance(put, RdmaTaskRemoteNetSyncEventNotifySet)
        _run(d, put)
        assert put.get_status() is DocaErrorCode.SUCCESS
        assert event.get() == U64_MAX - 1
        mem[8:16] = _word(100)
        _run(d, put)  # the same task again writes the same word, not the one after it
        assert event.get() == 100

        add = rdma.task_remote_net_sync_event_notify_add_allocate_init(remote, d.a.room(m, 16, 8), 5)
        assert isinstance(add, RdmaTaskRemoteNetSyncEventNotifyAdd)
        assert add.get_add_data() == 5
        _run(d, add)
        assert add.get_status() is DocaErrorCode.SUCCESS
        assert bytes(mem[16:24]) == _word(100)
        assert event.get() == 105
        for t in (get, put, add):
            t.free()
        remote.destroy()
        assert remote.destroyed
    finally:
        event.close()


def test_remote_get_set_add_reach_the_owners_counter(duo: Duo) -> None:
    """doca_rdma_task_remote_net_sync_event_{get,notify_set,notify_add} over soft UDP and TCP."""
    remote_tasks_scenario(duo)


def test_a_remote_add_wakes_the_owners_wait_task(duo: Duo) -> None:
    """The owner's wait-gt task completes in its engine's progress once the peer's add lands."""
    d = duo
    event = _owned_event(d)
    try:
        remote = SyncEventRemoteNet(d.a.dev, event.export_to_remote_net())
        wait = event.task_wait_gt_alloc_init(2)
        wait.submit()
        m, _ = d.a.mmap(8)
        add = d.a.rdma.task_remote_net_sync_event_notify_add_allocate_init(remote, d.a.room(m, 0, 8), 3)
        _run(d, add)
        d._until(lambda: wait in d.done, lambda: "the wait")
        assert wait.get_ret_val() == 3
        assert event.wait_gt(2, timeout=1) == 3
        add.free()
        wait.free()
        remote.destroy()
    finally:
        event.close()


def test_export_needs_a_remote_publisher_and_a_device(duo: Duo) -> None:
    """doca_sync_event_export_to_remote_net: NOT_PERMITTED without its locations; BAD_STATE unless running."""
    d = duo
    event = _owned_event(d, remote=False)
    try:
        assert error_code(event.export_to_remote_net) is DocaErrorCode.NOT_PERMITTED
    finally:
        event.close()
    bare = SyncEvent()
    bare.add_publisher_location_remote_net()
    assert error_code(bare.export_to_remote_net) is DocaErrorCode.BAD_STATE
    bare.start()
    assert error_code(bare.export_to_remote_net) is DocaErrorCode.NOT_PERMITTED
    bare.close()


def test_a_stopped_event_refuses_the_peer(duo: Duo) -> None:
    """After the owner stops, the peer's rkey is dead: the task fails, with the remote access error."""
    d = duo
    event = _owned_event(d)
    remote = SyncEventRemoteNet(d.a.dev, event.export_to_remote_net())
    event.stop()
    m, _ = d.a.mmap(8)
    add = d.a.rdma.task_remote_net_sync_event_notify_add_allocate_init(remote, d.a.room(m, 0, 8), 1)
    _run(d, add)
    assert add.get_status() is DocaErrorCode.NOT_PERMITTED  # the peer's NAK: remote access error
    assert add.error is not None
    assert "REM_ACCESS_ERR" in str(add.error)
    event.close()


def test_hostile_exports_are_refused(new_ip: Callable[[], str]) -> None:
    """create_from_export checks what a peer sent: garbage, a larger range, missing permissions."""
    with Dev.open(f"udp:{new_ip()}") as dev:
        for junk in (b"", b"\xff" * 64, b'{"format": "rdmakit.mmap/1"}'):
            assert error_code(lambda: SyncEventRemoteNet(dev, junk)) is DocaErrorCode.INVALID_VALUE  # noqa: B023
        for size, perms in ((16, 0b1111), (8, 0b0011)):
            page = mmap.mmap(-1, mmap.PAGESIZE)  # aligned: only the size or permissions are wrong
            m = Mmap()
            m.set_memrange(memoryview(page)[:size])
            m.set_permissions(perms)
            m.add_dev(dev)
            m.start()
            export = m.export_rdma(dev)
            with pytest.raises(DocaError, match="8-byte word" if size != 8 else "grant") as info:
                SyncEventRemoteNet(dev, export)
            assert info.value.code is DocaErrorCode.INVALID_VALUE
            m.destroy()
