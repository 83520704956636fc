"""``doca_dma.h`` (DOCA 2.5+): the capability queries of the DMA context."""

from rdmakit.doca import PE, Dma, DocaErrorCode, Task, local_devinfo
from rdmakit.doca.backend import JobType
from rdmakit.doca.device import Dev
from tests.doca.fidelity.conftest import DuoFactory
from tests.doca.task_harness import ALL_RDMA
from tests.doca.util import all_closed, error_code


def _cb(task: Task, task_ud: object, ctx_ud: object) -> None: ...


def test_max_num_tasks_bounds_set_conf() -> None:
    """doca_dma_cap_get_max_num_tasks: "the maximum number of tasks"; doca_dma_task_memcpy_set_conf
    with more is refused (INVALID_VALUE), with that many accepted."""
    with PE() as pe, all_closed(Dev.open(local_devinfo(), pe=pe)) as dev, Dma(dev) as dma:
        most = dma.cap_get_max_num_tasks()
        assert error_code(lambda: dma.task_memcpy_set_conf(_cb, _cb, most + 1)) is DocaErrorCode.INVALID_VALUE
        dma.task_memcpy_set_conf(_cb, _cb, most)


def test_memcpy_capabilities_are_the_devices(make_duo: DuoFactory) -> None:
    """doca_dma_cap_task_memcpy_is_supported, _get_max_buf_size, _get_max_buf_list_len: the device's
    values; a device that does not copy is NOT_SUPPORTED."""
    info = local_devinfo()
    Dma.cap_task_memcpy_is_supported(info)
    assert Dma.cap_task_memcpy_get_max_buf_size(info) == info.caps.max_buf_size
    assert Dma.cap_task_memcpy_get_max_buf_list_len(info) == info.caps.max_buf_list_len
    rdma_only = make_duo("task").a.dev.info
    if not rdma_only.is_job_supported(JobType.DMA_MEMCPY):
        assert error_code(lambda: Dma.cap_task_memcpy_is_supported(rdma_only)) is DocaErrorCode.NOT_SUPPORTED


def test_memory_on_another_machine_is_not_dmas(make_duo: DuoFactory) -> None:
    """doca_dma_task_memcpy_alloc_init copies between buffers the DMA context's device reaches: local
    memory, or on a DPU the host's (doca_mmap_export_pci). An mmap from doca_mmap_export_rdma is memory
    on another machine, which DOCA DMA never reaches (that is doca_rdma's read and write): the task
    is NOT_SUPPORTED at submit (DOCA 2.5+; the 2.0 job API the same)."""
    d = make_duo("task")
    if not d.b.dev.info.is_job_supported(JobType.DMA_MEMCPY):
        return  # a device that does not copy at all (verbs) refuses Dma() itself
    mine, _ = d.a.mmap(b"another machine", ALL_RDMA)
    far = d.share(mine, to="b")
    near, _ = d.b.mmap(32)
    with Dma(d.b.dev) as dma:
        dma.task_memcpy_set_conf(_cb, _cb, 2)
        d.pe.connect_ctx(dma)
        dma.start()
        task = dma.task_memcpy_alloc_init(d.b.data(far, 0, 15), d.b.room(near, 0, 32))
        assert error_code(task.submit) is DocaErrorCode.NOT_SUPPORTED
        task.free()
        dma.stop()
