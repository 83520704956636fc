"""DOCA RDMA tasks (DOCA 2.5+ ``doca_rdma.h``, "DOCA RDMA Tasks"): the task API of `Rdma`.

=============================  ==========================================  ====================
task (``doca_rdma_task_*``)    ``task_<x>_allocate_init`` arguments        runs as
=============================  ==========================================  ====================
`RdmaTaskReceive`              dst_buf                                     `RdmaRecvJob`
`RdmaTaskSend`                 src_buf                                     `RdmaSendJob`
`RdmaTaskSendImm`              src_buf, immediate_data                     `RdmaSendImmJob`
`RdmaTaskRead`                 src_buf (remote), dst_buf                   `RdmaReadJob`
`RdmaTaskWrite`                src_buf, dst_buf (remote)                   `RdmaWriteJob`
`RdmaTaskWriteImm`             src_buf, dst_buf (remote), immediate_data   `RdmaWriteImmJob`
`RdmaTaskAtomicCmpSwp`         dst_buf (remote), result_buf, cmp, swap     `RdmaAtomicCmpSwpJob`
`RdmaTaskAtomicFetchAdd`       dst_buf (remote), result_buf, add           `RdmaAtomicFetchAddJob`
=============================  ==========================================  ====================

Each type has ``Rdma.task_<x>_set_conf(success_cb, error_cb, num_tasks)``
(IDLE only) and ``Rdma.task_<x>_allocate_init(..., user_data)`` (also spelt
``task_<x>_alloc_init``), the getters and setters of its fields
(``get_src_buf``/``set_src_buf`` ...) and its results: a receive's
``get_result_opcode``, ``get_result_len``, ``get_result_immediate_data``
(``doca_be32_t``: the wire value, as the job API's ``RdmaResult.immediate``)
and ``get_result_rdma_connection``; a read's ``get_result_len``. A task runs
as the job in the right column, through the same planning and completion
code (``rdmakit.doca.rdma_jobs``), so the buffer and permission rules, the
errors and the results are the job API's.

Connections (DOCA 2.7+): every task runs on one connection of its context,
the ``rdma_connection`` argument of ``allocate_init`` (a receive's too) or
``set_rdma_connection``: an `RdmaConnection` of the context, or None (also
the context itself) for the context's only connection (``rdmakit.doca.rdma_cm``
says which that is). ``get_rdma_connection`` returns the connection, or the
context when none was named; a receive's ``get_result_rdma_connection`` the
connection the message came on (the context, connected by descriptor).
The remote net sync event tasks
(``doca_rdma_task_remote_net_sync_event_*``) are in
``rdmakit.doca.sync_event_remote``.
"""

from typing import Any, TypeVar

from rdmakit.doca.buf import Buf
from rdmakit.doca.ctx import Ctx, Job
from rdmakit.doca.errors import DocaError, DocaErrorCode
from rdmakit.doca.rdma_conns import RdmaConnection
from rdmakit.doca.rdma_jobs import (
    RdmaAtomicCmpSwpJob,
    RdmaAtomicFetchAddJob,
    RdmaOpcode,
    RdmaReadJob,
    RdmaRecvJob,
    RdmaResult,
    RdmaSendImmJob,
    RdmaSendJob,
    RdmaWriteImmJob,
    RdmaWriteJob,
)
from rdmakit.doca.tasks import Task, TaskCallback, set_task_conf

__all__ = [  # RdmaTaskApi: a base of Rdma
    "RdmaTaskAtomicCmpSwp",
    "RdmaTaskAtomicFetchAdd",
    "RdmaTaskRead",
    "RdmaTaskReceive",
    "RdmaTaskSend",
    "RdmaTaskSendImm",
    "RdmaTaskWrite",
    "RdmaTaskWriteImm",
]


def connection_arg(ctx: Ctx[Any], rdma_connection: object) -> RdmaConnection | None:
    """A task's connection: one of `ctx`'s, or None (also `ctx` itself) for its only one."""
    if rdma_connection is None or rdma_connection is ctx:
        return None
    if isinstance(rdma_connection, RdmaConnection) and rdma_connection.rdma is ctx:
        return rdma_connection
    raise DocaError(
        DocaErrorCode.INVALID_VALUE,
        f"{rdma_connection!r} is not a connection of this context (pass one of its RdmaConnection s, "
        "or None for its only connection)",
    )


class _RdmaTask(Task):
    __slots__ = ("_connection",)

    def __init__(self, ctx: Ctx[Any], user_data: object) -> None:
        super().__init__(ctx, user_data)
        self._connection: RdmaConnection | None = None

    def _rdma_result(self) -> RdmaResult:
        res = self._result
        return res if isinstance(res, RdmaResult) else RdmaResult()

    def get_rdma_connection(self) -> RdmaConnection | Ctx[Any]:
        """``doca_rdma_task_<x>_get_rdma_connection``: the connection, or the context if none was named."""
        return self._ctx if self._connection is None else self._connection

    def set_rdma_connection(self, rdma_connection: object) -> None:
        """``doca_rdma_task_<x>_set_rdma_connection``: INVALID_VALUE unless a connection of the context."""
        self._connection = connection_arg(self._ctx, rdma_connection)
        self._changed()


class _SrcBuf(_RdmaTask):
    __slots__ = ("_src_buf",)
    _src_buf: Buf | None

    def get_src_buf(self) -> Buf | None:
        return self._src_buf

    def set_src_buf(self, src_buf: Buf | None) -> None:
        self._src_buf = src_buf
        self._changed()


class _SrcDst(_RdmaTask):
    __slots__ = ("_dst_buf", "_src_buf")
    _src_buf: Buf
    _dst_buf: Buf

    def get_src_buf(self) -> Buf:
        return self._src_buf

    def set_src_buf(self, src_buf: Buf) -> None:
        self._src_buf = src_buf
        self._changed()

    def get_dst_buf(self) -> Buf:
        return self._dst_buf

    def set_dst_buf(self, dst_buf: Buf) -> None:
        self._dst_buf = dst_buf
        self._changed()


class RdmaTaskReceive(_RdmaTask):
    """``doca_rdma_task_receive``: the peer's next send, send with immediate or write with immediate."""

    __slots__ = ("_dst_buf",)
    doca_name = "doca_rdma_task_receive"
    _job_class = RdmaRecvJob
    _job_fields = (("_connection", "connection"), ("_dst_buf", "dst_buf"))

    def __init__(self, ctx: Ctx[Any], dst_buf: Buf | None, user_data: object = None) -> None:
        super().__init__(ctx, user_data)
        self._dst_buf = dst_buf

    def get_dst_buf(self) -> Buf | None:
        return self._dst_buf

    def set_dst_buf(self, dst_buf: Buf | None) -> None:
        self._dst_buf = dst_buf
        self._changed()

    def get_result_opcode(self) -> RdmaOpcode | None:
        """What the peer did (``doca_rdma_task_receive_get_result_opcode``); valid once completed."""
        return self._rdma_result().opcode

    def get_result_len(self) -> int:
        """Bytes received, or written by a write with immediate (``..._get_result_len``)."""
        return self._rdma_result().length

    def get_result_immediate_data(self) -> int | None:
        """The immediate as on the wire (``doca_be32_t``), None without one."""
        return self._rdma_result().immediate

    def get_result_rdma_connection(self) -> RdmaConnection | Ctx[Any]:
        """The connection the message came on; the context when it is connected by descriptor."""
        conn = self._rdma_result().connection
        return self._ctx if conn is None else conn


class RdmaTaskSend(_SrcBuf):
    """``doca_rdma_task_send``: send ``src_buf``'s data (None: an empty message)."""

    __slots__ = ()
    doca_name = "doca_rdma_task_send"
    _job_class = RdmaSendJob
    _job_fields = (("_connection", "connection"), ("_src_buf", "src_buf"))

    def __init__(self, ctx: Ctx[Any], src_buf: Buf | None, user_data: object = None) -> None:
        super().__init__(ctx, user_data)
        self._src_buf = src_buf


class RdmaTaskSendImm(_SrcBuf):
    """``doca_rdma_task_send_imm``: send with a 32-bit immediate."""

    __slots__ = ("_immediate",)
    doca_name = "doca_rdma_task_send_imm"
    _job_class = RdmaSendImmJob
    _job_fields = (("_connection", "connection"), ("_src_buf", "src_buf"), ("_immediate", "immediate"))

    def __init__(self, ctx: Ctx[Any], src_buf: Buf | None, immediate_data: int, user_data: object) -> None:
        super().__init__(ctx, user_data)
        self._src_buf = src_buf
        self._immediate = immediate_data

    def get_immediate_data(self) -> int:
        return self._immediate

    def set_immediate_data(self, immediate_data: int) -> None:
        self._immediate = immediate_data
        self._changed()


class RdmaTaskRead(_SrcDst):
    """``doca_rdma_task_read``: read remote ``src_buf`` into local ``dst_buf`` (appended)."""

    __slots__ = ()
    doca_name = "doca_rdma_task_read"
    _job_class = RdmaReadJob
    _job_fields = (("_connection", "connection"), ("_src_buf", "src_buf"), ("_dst_buf", "dst_buf"))

    def __init__(self, ctx: Ctx[Any], src_buf: Buf, dst_buf: Buf, user_data: object = None) -> None:
        super().__init__(ctx, user_data)
        self._src_buf, self._dst_buf = src_buf, dst_buf

    def get_result_len(self) -> int:
        """Bytes read (``doca_rdma_task_read_get_result_len``)."""
        return self._rdma_result().length


class RdmaTaskWrite(_SrcDst):
    """``doca_rdma_task_write``: write local ``src_buf`` after remote ``dst_buf``'s data."""

    __slots__ = ()
    doca_name = "doca_rdma_task_write"
    _job_class = RdmaWriteJob
    _job_fields = (("_connection", "connection"), ("_src_buf", "src_buf"), ("_dst_buf", "dst_buf"))

    def __init__(self, ctx: Ctx[Any], src_buf: Buf, dst_buf: Buf, user_data: object = None) -> None:
        super().__init__(ctx, user_data)
        self._src_buf, self._dst_buf = src_buf, dst_buf


class RdmaTaskWriteImm(_SrcDst):
    """``doca_rdma_task_write_imm``: a write that also consumes a receive at the peer."""

    __slots__ = ("_immediate",)
    doca_name = "doca_rdma_task_write_imm"
    _job_class = RdmaWriteImmJob
    _job_fields = (
        ("_connection", "connection"),
        ("_src_buf", "src_buf"),
        ("_dst_buf", "dst_buf"),
        ("_immediate", "immediate"),
    )

    def __init__(
        self, ctx: Ctx[Any], src_buf: Buf, dst_buf: Buf, immediate_data: int, user_data: object = None
    ) -> None:
        super().__init__(ctx, user_data)
        self._src_buf, self._dst_buf, self._immediate = src_buf, dst_buf, immediate_data

    def get_immediate_data(self) -> int:
        return self._immediate

    def set_immediate_data(self, immediate_data: int) -> None:
        self._immediate = immediate_data
        self._changed()


class _Atomic(_RdmaTask):
    __slots__ = ("_dst_buf", "_result_buf")
    _dst_buf: Buf
    _result_buf: Buf

    def get_dst_buf(self) -> Buf:
        return self._dst_buf

    def set_dst_buf(self, dst_buf: Buf) -> None:
        self._dst_buf = dst_buf
        self._changed()

    def get_result_buf(self) -> Buf:
        return self._result_buf

    def set_result_buf(self, result_buf: Buf) -> None:
        self._result_buf = result_buf
        self._changed()


class RdmaTaskAtomicCmpSwp(_Atomic):
    """``doca_rdma_task_atomic_cmp_swp``: the remote u64's old value is appended to ``result_buf``."""

    __slots__ = ("_cmp", "_swap")
    doca_name = "doca_rdma_task_atomic_cmp_swp"
    _job_class = RdmaAtomicCmpSwpJob
    _job_fields = (
        ("_connection", "connection"),
        ("_dst_buf", "dst_buf"),
        ("_result_buf", "result_buf"),
        ("_cmp", "cmp"),
        ("_swap", "swap"),
    )

    def __init__(
        self, ctx: Ctx[Any], dst_buf: Buf, result_buf: Buf, cmp_data: int, swap_data: int, user_data: object
    ) -> None:
        super().__init__(ctx, user_data)
        self._dst_buf, self._result_buf, self._cmp, self._swap = dst_buf, result_buf, cmp_data, swap_data

    def get_cmp_data(self) -> int:
        return self._cmp

    def set_cmp_data(self, cmp_data: int) -> None:
        self._cmp = cmp_data
        self._changed()

    def get_swap_data(self) -> int:
        return self._swap

    def set_swap_data(self, swap_data: int) -> None:
        self._swap = swap_data
        self._changed()


class RdmaTaskAtomicFetchAdd(_Atomic):
    """``doca_rdma_task_atomic_fetch_add``: the remote u64's old value is appended to ``result_buf``."""

    __slots__ = ("_add",)
    doca_name = "doca_rdma_task_atomic_fetch_add"
    _job_class = RdmaAtomicFetchAddJob
    _job_fields = (
        ("_connection", "connection"),
        ("_dst_buf", "dst_buf"),
        ("_result_buf", "result_buf"),
        ("_add", "add"),
    )

    def __init__(
        self, ctx: Ctx[Any], dst_buf: Buf, result_buf: Buf, add_data: int, user_data: object
    ) -> None:
        super().__init__(ctx, user_data)
        self._dst_buf, self._result_buf, self._add = dst_buf, result_buf, add_data

    def get_add_data(self) -> int:
        return self._add

    def set_add_data(self, add_data: int) -> None:
        self._add = add_data
        self._changed()


_T = TypeVar("_T", bound=_RdmaTask)


class RdmaTaskApi(Ctx[Job]):
    """The task half of `Rdma`: per type ``task_<x>_set_conf`` and ``task_<x>_allocate_init``."""

    def _on(self, task: _T, rdma_connection: object) -> _T:
        """`task`, set to run on `rdma_connection` (None: the context's only connection)."""
        try:
            task._connection = connection_arg(self, rdma_connection)
        except BaseException:
            task.free()
            raise
        return task

    # receive
    def task_receive_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskReceive],
        error_cb: TaskCallback[RdmaTaskReceive],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_receive_set_conf``."""
        set_task_conf(self, RdmaTaskReceive, success_cb, error_cb, num_tasks)

    def task_receive_allocate_init(
        self, dst_buf: Buf | None, user_data: object = None, *, rdma_connection: object = None
    ) -> RdmaTaskReceive:
        """``doca_rdma_task_receive_allocate_init``; NO_MEMORY when the pool is exhausted."""
        return self._on(RdmaTaskReceive(self, dst_buf, user_data), rdma_connection)

    task_receive_alloc_init = task_receive_allocate_init

    # send
    def task_send_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskSend],
        error_cb: TaskCallback[RdmaTaskSend],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_send_set_conf``."""
        set_task_conf(self, RdmaTaskSend, success_cb, error_cb, num_tasks)

    def task_send_allocate_init(
        self, src_buf: Buf | None, user_data: object = None, *, rdma_connection: object = None
    ) -> RdmaTaskSend:
        """``doca_rdma_task_send_allocate_init``."""
        return self._on(RdmaTaskSend(self, src_buf, user_data), rdma_connection)

    task_send_alloc_init = task_send_allocate_init

    # send with immediate
    def task_send_imm_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskSendImm],
        error_cb: TaskCallback[RdmaTaskSendImm],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_send_imm_set_conf``."""
        set_task_conf(self, RdmaTaskSendImm, success_cb, error_cb, num_tasks)

    def task_send_imm_allocate_init(
        self,
        src_buf: Buf | None,
        immediate_data: int,
        user_data: object = None,
        *,
        rdma_connection: object = None,
    ) -> RdmaTaskSendImm:
        """``doca_rdma_task_send_imm_allocate_init``."""
        return self._on(RdmaTaskSendImm(self, src_buf, immediate_data, user_data), rdma_connection)

    task_send_imm_alloc_init = task_send_imm_allocate_init

    # read
    def task_read_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskRead],
        error_cb: TaskCallback[RdmaTaskRead],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_read_set_conf``."""
        set_task_conf(self, RdmaTaskRead, success_cb, error_cb, num_tasks)

    def task_read_allocate_init(
        self, src_buf: Buf, dst_buf: Buf, user_data: object = None, *, rdma_connection: object = None
    ) -> RdmaTaskRead:
        """``doca_rdma_task_read_allocate_init``."""
        return self._on(RdmaTaskRead(self, src_buf, dst_buf, user_data), rdma_connection)

    task_read_alloc_init = task_read_allocate_init

    # write
    def task_write_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskWrite],
        error_cb: TaskCallback[RdmaTaskWrite],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_write_set_conf``."""
        set_task_conf(self, RdmaTaskWrite, success_cb, error_cb, num_tasks)

    def task_write_allocate_init(
        self, src_buf: Buf, dst_buf: Buf, user_data: object = None, *, rdma_connection: object = None
    ) -> RdmaTaskWrite:
        """``doca_rdma_task_write_allocate_init``."""
        return self._on(RdmaTaskWrite(self, src_buf, dst_buf, user_data), rdma_connection)

    task_write_alloc_init = task_write_allocate_init

    # write with immediate
    def task_write_imm_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskWriteImm],
        error_cb: TaskCallback[RdmaTaskWriteImm],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_write_imm_set_conf``."""
        set_task_conf(self, RdmaTaskWriteImm, success_cb, error_cb, num_tasks)

    def task_write_imm_allocate_init(
        self,
        src_buf: Buf,
        dst_buf: Buf,
        immediate_data: int,
        user_data: object = None,
        *,
        rdma_connection: object = None,
    ) -> RdmaTaskWriteImm:
        """``doca_rdma_task_write_imm_allocate_init``."""
        return self._on(RdmaTaskWriteImm(self, src_buf, dst_buf, immediate_data, user_data), rdma_connection)

    task_write_imm_alloc_init = task_write_imm_allocate_init

    # atomic compare and swap
    def task_atomic_cmp_swp_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskAtomicCmpSwp],
        error_cb: TaskCallback[RdmaTaskAtomicCmpSwp],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_atomic_cmp_swp_set_conf``."""
        set_task_conf(self, RdmaTaskAtomicCmpSwp, success_cb, error_cb, num_tasks)

    def task_atomic_cmp_swp_allocate_init(
        self,
        dst_buf: Buf,
        result_buf: Buf,
        cmp_data: int,
        swap_data: int,
        user_data: object = None,
        *,
        rdma_connection: object = None,
    ) -> RdmaTaskAtomicCmpSwp:
        """``doca_rdma_task_atomic_cmp_swp_allocate_init``."""
        return self._on(
            RdmaTaskAtomicCmpSwp(self, dst_buf, result_buf, cmp_data, swap_data, user_data), rdma_connection
        )

    task_atomic_cmp_swp_alloc_init = task_atomic_cmp_swp_allocate_init

    # atomic fetch and add
    def task_atomic_fetch_add_set_conf(
        self,
        success_cb: TaskCallback[RdmaTaskAtomicFetchAdd],
        error_cb: TaskCallback[RdmaTaskAtomicFetchAdd],
        num_tasks: int,
    ) -> None:
        """``doca_rdma_task_atomic_fetch_add_set_conf``."""
        set_task_conf(self, RdmaTaskAtomicFetchAdd, success_cb, error_cb, num_tasks)

    def task_atomic_fetch_add_allocate_init(
        self,
        dst_buf: Buf,
        result_buf: Buf,
        add_data: int,
        user_data: object = None,
        *,
        rdma_connection: object = None,
    ) -> RdmaTaskAtomicFetchAdd:
        """``doca_rdma_task_atomic_fetch_add_allocate_init``."""
        return self._on(
            RdmaTaskAtomicFetchAdd(self, dst_buf, result_buf, add_data, user_data), rdma_connection
        )

    task_atomic_fetch_add_alloc_init = task_atomic_fetch_add_allocate_init
