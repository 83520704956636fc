"""A peer's sync event over the network, and the RDMA tasks that reach it.

DOCA 2.5+ (``doca_sync_event.h``, ``doca_rdma.h``): a process that owns a
`SyncEvent` with a remote-net publisher exports it
(``doca_sync_event_export_to_remote_net``); its peer imports the descriptor
(``doca_sync_event_remote_net_create_from_export``) and, over a connected
`Rdma` context, reads, sets and adds to the counter with three task types:

======================================  ======================================  ===================
task (``doca_rdma_task_remote_net_*``)  ``task_<x>_allocate_init`` arguments    runs as
======================================  ======================================  ===================
`RdmaTaskRemoteNetSyncEventGet`         event, dst_buf                          RDMA READ of 8 bytes
`RdmaTaskRemoteNetSyncEventNotifySet`   event, src_buf (the 8-byte value)       RDMA WRITE of 8 bytes
`RdmaTaskRemoteNetSyncEventNotifyAdd`   event, result_buf, add_data             FETCH_ADD
======================================  ======================================  ===================

The tasks run as the `Rdma` context's own read, write and fetch-and-add jobs,
so the buffer, permission and error rules are theirs. The counter is a
uint64 in the owner's byte order (the order RDMA atomics use on the owner's
host): a notify-set's ``src_buf`` and a get's ``dst_buf`` hold it that way.
The descriptor is checked as hostile input: it must name an 8-byte, 8-byte
aligned range that grants remote read, write and atomics.
"""

from typing import Any, Self

from rdmakit.doca._memory import AccessFlag
from rdmakit.doca.buf import Buf
from rdmakit.doca.ctx import Ctx, Job
from rdmakit.doca.device import Dev
from rdmakit.doca.errors import DocaError, DocaErrorCode
from rdmakit.doca.inventory import BufInventory
from rdmakit.doca.mmap import Mmap
from rdmakit.doca.rdma_jobs import RdmaAtomicFetchAddJob, RdmaReadJob, RdmaWriteJob
from rdmakit.doca.rdma_tasks import RdmaTaskApi, _RdmaTask
from rdmakit.doca.sync_event_tasks import check_u64
from rdmakit.doca.tasks import TaskCallback, set_task_conf

__all__ = [  # RdmaRemoteNetTaskApi: the base of Rdma
    "RdmaTaskRemoteNetSyncEventGet",
    "RdmaTaskRemoteNetSyncEventNotifyAdd",
    "RdmaTaskRemoteNetSyncEventNotifySet",
    "SyncEventRemoteNet",
]

_NEEDED = AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC


class SyncEventRemoteNet:
    """A peer's sync event, reachable over RDMA (``doca_sync_event_remote_net``)."""

    def __init__(self, dev: Dev, export: bytes) -> None:
        """Import `export` (``doca_sync_event_remote_net_create_from_export``).

        INVALID_VALUE unless it is the export of a sync event.
        """
        region = Mmap.create_from_export(export, dev)
        try:
            if region.length != 8 or region.addr & 7:
                raise DocaError(
                    DocaErrorCode.INVALID_VALUE,
                    "a remote sync event is one aligned 8-byte word, "
                    f"not {region.length} bytes at {region.addr:#x}",
                )
            if _NEEDED & ~region.permissions:
                raise DocaError(
                    DocaErrorCode.INVALID_VALUE,
                    "the exported sync event does not grant remote read, write and atomics",
                )
            self._inventory = BufInventory(1)
            self._inventory.start()
            self._word = self._inventory.get_by_data(region, region.addr, 8)
        except BaseException:
            region.destroy()
            raise
        self._mmap = region
        self._dev = dev

    @classmethod
    def create_from_export(cls, dev: Dev, export: bytes) -> Self:
        """``doca_sync_event_remote_net_create_from_export``."""
        return cls(dev, export)

    @property
    def mmap(self) -> Mmap:
        """The imported range of the peer's counter."""
        self._check_alive()
        return self._mmap

    @property
    def word(self) -> Buf:
        """A buffer whose data is the peer's counter: the source of a get, the target of an add."""
        self._check_alive()
        return self._word

    @property
    def destroyed(self) -> bool:
        return self._mmap.destroyed

    def _check_alive(self) -> None:
        if self._mmap.destroyed:
            raise DocaError(DocaErrorCode.BAD_STATE, "the remote sync event was destroyed")

    def destroy(self) -> None:
        """``doca_sync_event_remote_net_destroy``: NOT_PERMITTED while notify-set tasks still hold it."""
        if self._mmap.destroyed:
            return
        self._word.dec_refcount()
        try:
            self._mmap.destroy()
        except BaseException:
            self._word = self._inventory.get_by_data(self._mmap, self._mmap.addr, 8)
            raise
        self._inventory.destroy()

    def __repr__(self) -> str:
        state = "destroyed" if self.destroyed else f"{self._mmap.addr:#x}"
        return f"<SyncEventRemoteNet {state}>"


class _RemoteNetTask(_RdmaTask):
    __slots__ = ("_event",)
    _event: SyncEventRemoteNet

    def get_sync_event(self) -> SyncEventRemoteNet:
        """``doca_rdma_task_remote_net_sync_event_<x>_get_sync_event``."""
        return self._event


class RdmaTaskRemoteNetSyncEventGet(_RemoteNetTask):
    """``doca_rdma_task_remote_net_sync_event_get``: read the peer's counter into ``dst_buf``."""

    __slots__ = ("_dst_buf",)
    doca_name = "doca_rdma_task_remote_net_sync_event_get"

    def __init__(
        self, ctx: Ctx[Any], event: SyncEventRemoteNet, dst_buf: Buf, user_data: object = None
    ) -> None:
        event._check_alive()
        super().__init__(ctx, user_data)
        self._event, self._dst_buf = event, dst_buf

    def _make_job(self) -> Job:
        return RdmaReadJob(
            ctx=self._ctx, connection=self._connection, src_buf=self._event.word, dst_buf=self._dst_buf
        )

    def set_sync_event(self, event: SyncEventRemoteNet) -> None:
        event._check_alive()
        self._event = event
        self._changed()

    def get_dst_buf(self) -> Buf:
        return self._dst_buf

    def set_dst_buf(self, dst_buf: Buf) -> None:
        self._dst_buf = dst_buf
        self._changed()

    def get_result_len(self) -> int:
        """Bytes read (8 when the destination had room)."""
        return self._rdma_result().length


class RdmaTaskRemoteNetSyncEventNotifySet(_RemoteNetTask):
    """``doca_rdma_task_remote_net_sync_event_notify_set``: write ``src_buf``'s 8 bytes to the counter."""

    __slots__ = ("_inventory", "_src_buf", "_target")
    doca_name = "doca_rdma_task_remote_net_sync_event_notify_set"

    def __init__(
        self, ctx: Ctx[Any], event: SyncEventRemoteNet, src_buf: Buf, user_data: object = None
    ) -> None:
        event._check_alive()
        super().__init__(ctx, user_data)
        self._event, self._src_buf = event, src_buf
        # A write appends to its destination, so each task writes through an empty
        # buffer of its own, emptied again before every submit.
        self._inventory = BufInventory(1)
        self._inventory.start()
        self._target = self._inventory.get_by_addr(event.mmap, event.mmap.addr, 8)

    def _make_job(self) -> Job:
        if self._src_buf.data_len != 8:
            raise DocaError(
                DocaErrorCode.INVALID_VALUE,
                f"{self.doca_name}: src_buf holds {self._src_buf.data_len} bytes, not 8",
            )
        return RdmaWriteJob(
            ctx=self._ctx, connection=self._connection, src_buf=self._src_buf, dst_buf=self._target
        )

    def submit(self) -> None:
        self._target.reset_data_len()
        super().submit()

    def free(self) -> None:
        super().free()
        self._target.dec_refcount()
        self._inventory.destroy()

    def set_sync_event(self, event: SyncEventRemoteNet) -> None:
        target = event.mmap  # BAD_STATE if destroyed, before anything changes
        self._target.dec_refcount()
        self._event = event
        self._target = self._inventory.get_by_addr(target, target.addr, 8)
        self._changed()

    def get_src_buf(self) -> Buf:
        return self._src_buf

    def set_src_buf(self, src_buf: Buf) -> None:
        self._src_buf = src_buf
        self._changed()


class RdmaTaskRemoteNetSyncEventNotifyAdd(_RemoteNetTask):
    """``doca_rdma_task_remote_net_sync_event_notify_add``: add; ``result_buf`` gets the value before."""

    __slots__ = ("_add_data", "_result_buf")
    doca_name = "doca_rdma_task_remote_net_sync_event_notify_add"

    def __init__(
        self,
        ctx: Ctx[Any],
        event: SyncEventRemoteNet,
        result_buf: Buf,
        add_data: int,
        user_data: object = None,
    ) -> None:
        event._check_alive()
        check_u64("add_data", add_data)
        super().__init__(ctx, user_data)
        self._event, self._result_buf, self._add_data = event, result_buf, add_data

    def _make_job(self) -> Job:
        return RdmaAtomicFetchAddJob(
            ctx=self._ctx,
            connection=self._connection,
            dst_buf=self._event.word,
            result_buf=self._result_buf,
            add=self._add_data,
        )

    def set_sync_event(self, event: SyncEventRemoteNet) -> None:
        event._check_alive()
        self._event = event
        self._changed()

    def get_result_buf(self) -> Buf:
        return self._result_buf

    def set_result_buf(self, result_buf: Buf) -> None:
        self._result_buf = result_buf
        self._changed()

    def get_add_data(self) -> int:
        return self._add_data

    def set_add_data(self, add_data: int) -> None:
        check_u64("add_data", add_data)
        self._add_data = add_data
        self._changed()


class RdmaRemoteNetTaskApi(RdmaTaskApi):
    """The task API of `Rdma`, with the remote net sync event tasks."""

    def task_remote_net_sync_event_get_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskRemoteNetSyncEventGet],
        error_cb: TaskCallback[RdmaTaskRemoteNetSyncEventGet],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_remote_net_sync_event_get_set_conf``."""
        set_task_conf(self, RdmaTaskRemoteNetSyncEventGet, success_cb, error_cb, num_tasks)

    def task_remote_net_sync_event_get_allocate_init(
        self,
        event: SyncEventRemoteNet,
        dst_buf: Buf,
        user_data: object = None,
        *,
        rdma_connection: object = None,
    ) -> RdmaTaskRemoteNetSyncEventGet:
        """``doca_rdma_task_remote_net_sync_event_get_allocate_init``."""
        return self._on(RdmaTaskRemoteNetSyncEventGet(self, event, dst_buf, user_data), rdma_connection)

    def task_remote_net_sync_event_notify_set_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskRemoteNetSyncEventNotifySet],
        error_cb: TaskCallback[RdmaTaskRemoteNetSyncEventNotifySet],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_remote_net_sync_event_notify_set_set_conf``."""
        set_task_conf(self, RdmaTaskRemoteNetSyncEventNotifySet, success_cb, error_cb, num_tasks)

    def task_remote_net_sync_event_notify_set_allocate_init(
        self,
        event: SyncEventRemoteNet,
        src_buf: Buf,
        user_data: object = None,
        *,
        rdma_connection: object = None,
    ) -> RdmaTaskRemoteNetSyncEventNotifySet:
        """``doca_rdma_task_remote_net_sync_event_notify_set_allocate_init``."""
        return self._on(RdmaTaskRemoteNetSyncEventNotifySet(self, event, src_buf, user_data), rdma_connection)

    def task_remote_net_sync_event_notify_add_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskRemoteNetSyncEventNotifyAdd],
        error_cb: TaskCallback[RdmaTaskRemoteNetSyncEventNotifyAdd],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_remote_net_sync_event_notify_add_set_conf``."""
        set_task_conf(self, RdmaTaskRemoteNetSyncEventNotifyAdd, success_cb, error_cb, num_tasks)

    def task_remote_net_sync_event_notify_add_allocate_init(
        self,
        event: SyncEventRemoteNet,
        result_buf: Buf,
        add_data: int,
        user_data: object = None,
        *,
        rdma_connection: object = None,
    ) -> RdmaTaskRemoteNetSyncEventNotifyAdd:
        """``doca_rdma_task_remote_net_sync_event_notify_add_allocate_init``."""
        return self._on(
            RdmaTaskRemoteNetSyncEventNotifyAdd(self, event, result_buf, add_data, user_data), rdma_connection
        )

    task_remote_net_sync_event_get_alloc_init = task_remote_net_sync_event_get_allocate_init
    task_remote_net_sync_event_notify_set_alloc_init = task_remote_net_sync_event_notify_set_allocate_init
    task_remote_net_sync_event_notify_add_alloc_init = task_remote_net_sync_event_notify_add_allocate_init
