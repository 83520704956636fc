"""DMA Copy's control path on doca_comch: the DPU's server listens to its first connection only."""

import time
import uuid

from rdmakit.cli.dma_comch import ComchEndpoint
from rdmakit.doca import ComchClient, ComchTaskSend, CtxState, Dev, DocaErrorCode, local_devinfo
from tests.doca.util import error_code


def _client(dev: Dev, service: str) -> ComchClient:
    c = ComchClient(dev, service)
    dev.pe.connect_ctx(c)
    c.task_send_set_conf(_free, _free, 4)
    c.event_msg_recv_register(lambda *a: None)
    c.start()
    return c


def _free(task: ComchTaskSend, task_ud: object, ctx_ud: object) -> None:
    task.free()


def test_the_dpu_hears_its_first_client_only() -> None:
    service = f"test-dma-comch-{uuid.uuid4().hex[:12]}"
    with Dev.open(local_devinfo("dmacomch0")) as dev:
        host = _client(dev, service)
        intruder: ComchClient | None = None
        try:
            with ComchEndpoint.accept(dev, service, timeout=20, secret_file=None) as dpu:
                deadline = time.monotonic() + 20
                while host.state is not CtxState.RUNNING and time.monotonic() < deadline:
                    dev.pe.progress()
                assert host.state is CtxState.RUNNING
                intruder = _client(dev, service)
                while intruder.state is CtxState.STARTING and time.monotonic() < deadline:
                    dev.pe.progress()
                if intruder.state is CtxState.RUNNING:  # connected, then dropped by the DPU
                    conn = intruder.get_connection()
                    intruder.task_send_alloc_init(conn, b"from the intruder").submit()
                    while conn.connected and time.monotonic() < deadline:
                        dev.pe.progress()
                    assert not conn.connected
                host.task_send_alloc_init(host.get_connection(), b"from the host").submit()
                assert dpu.recv(20) == b"from the host"
                assert dpu.try_recv() is None
                assert error_code(lambda: dpu.recv(0.05)) is DocaErrorCode.TIME_OUT
        finally:
            host.close()
            if intruder is not None:
                intruder.close()
