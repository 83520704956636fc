"""DOCA DMA memcpy: the job and the task (``doca_dma.h``, ``doca_dma_task_memcpy``).

`DmaMemcpyJob` is the job API's request; `DmaTaskMemcpy` the task of DOCA
2.5+, made by ``Dma.task_memcpy_alloc_init(src, dst, user_data)`` from the
pool configured with ``Dma.task_memcpy_set_conf(success_cb, error_cb,
num_tasks)``, with ``get_src``/``set_src``, ``get_dst``/``set_dst`` as
``doca_dma_task_memcpy_get_src`` and friends. A task runs as the job: the
buffer rules, errors and the copy are the `Dma` context's (``rdmakit.doca.dma``).
"""

from dataclasses import dataclass
from typing import Any

from rdmakit.doca.backend import JobType
from rdmakit.doca.buf import Buf
from rdmakit.doca.ctx import Ctx, Job
from rdmakit.doca.device import DevInfo
from rdmakit.doca.errors import DocaError, DocaErrorCode, Fault
from rdmakit.doca.tasks import U32, Task, TaskCallback, set_task_conf

__all__ = ["DmaMemcpyJob", "DmaTaskMemcpy"]  # DmaTaskApi: a base of Dma


@dataclass(frozen=True, slots=True, kw_only=True)
class DmaMemcpyJob(Job):
    """Copy `src`'s data to the tail of `dst` (``doca_dma_task_memcpy``); ``result`` is the byte count."""

    src: Buf
    dst: Buf


class DmaTaskMemcpy(Task):
    """``doca_dma_task_memcpy``: copy ``src``'s data to the tail of ``dst``."""

    __slots__ = ("_dst", "_src")
    doca_name = "doca_dma_task_memcpy"
    _job_class = DmaMemcpyJob
    _job_fields = (("_src", "src"), ("_dst", "dst"))

    def __init__(self, ctx: Ctx[Any], src: Buf, dst: Buf, user_data: object = None) -> None:
        super().__init__(ctx, user_data)
        self._src, self._dst = src, dst

    def get_src(self) -> Buf:
        """``doca_dma_task_memcpy_get_src``."""
        return self._src

    def set_src(self, src: Buf) -> None:
        """``doca_dma_task_memcpy_set_src``."""
        self._src = src
        self._changed()

    def get_dst(self) -> Buf:
        """``doca_dma_task_memcpy_get_dst``."""
        return self._dst

    def set_dst(self, dst: Buf) -> None:
        """``doca_dma_task_memcpy_set_dst``."""
        self._dst = dst
        self._changed()

    def get_result_len(self) -> int:
        """Bytes copied, once completed successfully (the job's result)."""
        return self._result if isinstance(self._result, int) else 0


class DmaTaskApi(Ctx[DmaMemcpyJob]):
    """The task half of `Dma`, with the capability queries of ``doca_dma.h`` (DOCA 2.5+)."""

    def cap_get_max_num_tasks(self) -> int:
        """``doca_dma_cap_get_max_num_tasks``: the largest ``num_tasks`` `task_memcpy_set_conf` takes.

        A copy runs on the CPU (or as RDMA pieces on a queue pair of its own
        depth), so the pool is bounded by the uint32 of ``set_conf`` only.
        """
        return U32

    @staticmethod
    def cap_task_memcpy_is_supported(devinfo: DevInfo) -> None:
        """``doca_dma_cap_task_memcpy_is_supported``: NOT_SUPPORTED unless the device copies."""
        if not devinfo.is_job_supported(JobType.DMA_MEMCPY):
            raise DocaError(
                DocaErrorCode.NOT_SUPPORTED, f"{devinfo.name} does not run DMA memcpy tasks", Fault.SYSTEM
            )

    @staticmethod
    def cap_task_memcpy_get_max_buf_size(devinfo: DevInfo) -> int:
        """``doca_dma_cap_task_memcpy_get_max_buf_size``: the device's largest buffer."""
        return devinfo.max_buf_size()

    @staticmethod
    def cap_task_memcpy_get_max_buf_list_len(devinfo: DevInfo) -> int:
        """``doca_dma_cap_task_memcpy_get_max_buf_list_len``: the device's longest buffer list."""
        return devinfo.max_buf_list_len()

    def task_memcpy_set_conf(
        self,
        success_cb: TaskCallback[DmaTaskMemcpy],
        error_cb: TaskCallback[DmaTaskMemcpy],
        num_tasks: int,
    ) -> None:
        """``doca_dma_task_memcpy_set_conf``: callbacks and pool size, IDLE only."""
        set_task_conf(self, DmaTaskMemcpy, success_cb, error_cb, num_tasks)

    def task_memcpy_alloc_init(self, src: Buf, dst: Buf, user_data: object = None) -> DmaTaskMemcpy:
        """``doca_dma_task_memcpy_alloc_init``; NO_MEMORY when the pool is exhausted."""
        return DmaTaskMemcpy(self, src, dst, user_data)
