"""``doca_dma.h`` (DOCA 2.5+): the capability queries of the DMA context."""

from rdmakit.doca import PE, Dma, DocaErrorCode, Task, local_devinfo
from rdmakit.doca.backend import JobType
from rdmakit.doca.device import Dev
from tests.doca.fidelity.conftest import DuoFactory
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
