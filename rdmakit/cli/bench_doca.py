"""The DOCA-level figure of ``rdmakit bench``: an 8-byte RDMA WRITE round trip, job API vs task API.

Two soft RoCEv2 devices in this process on one progress engine, one `Rdma`
context each; the requester writes 8 bytes into the responder's memory and
waits for the completion, one at a time. Through the job API that is
``WorkQ.submit`` and ``progress_retrieve`` (``doca_workq``); through the task
API ``doca_task_submit`` and ``doca_pe_progress`` until the task's callback
ran, resubmitting the same task object. Both run the same context code, so
the figure is the cost of each API's layer.
"""

import contextlib
import statistics
import time
from typing import Literal

from rdmakit.doca import (
    PE,
    AccessFlag,
    BufInventory,
    CtxState,
    Dev,
    DocaError,
    Mmap,
    Rdma,
    RdmaTaskWrite,
    RdmaWriteJob,
    WorkQ,
)

Api = Literal["job", "task"]


def write_round_trip(api: Api, ip_a: str, ip_b: str, count: int) -> float:
    """Median seconds of `count` 8-byte WRITE round trips through `api` (after a warm-up)."""
    pe = PE()
    devs = [Dev.open(ip, pe=pe) for ip in (ip_a, ip_b)]
    ctxs = [Rdma(), Rdma()]
    wqs: list[WorkQ] = []
    done: list[RdmaTaskWrite] = []
    inv = BufInventory(8)
    inv.start()
    mmaps: list[Mmap] = []
    try:
        for dev, rdma, perms in zip(
            devs, ctxs, (AccessFlag.LOCAL_READ_WRITE, AccessFlag.RDMA_WRITE), strict=True
        ):
            rdma.add_dev(dev)
            rdma.set_permissions(perms | AccessFlag.LOCAL_READ_WRITE)
            if api == "job":
                wqs.append(WorkQ(4, pe=pe))
                rdma.workq_add(wqs[-1])
            else:
                pe.connect_ctx(rdma)
                rdma.task_write_set_conf(lambda t, u, c: done.append(t), lambda t, u, c: done.append(t), 1)
            rdma.start()
        a, b = ctxs
        da, db = a.export(), b.export()
        a.connect(db)
        b.connect(da)
        # doca_rdma_connect: on a PE the contexts are RUNNING after the next progress.
        while a.state is CtxState.STARTING or b.state is CtxState.STARTING:
            pe.progress()
        for dev, mem, perms in (
            (devs[0], bytearray(b"8 bytes!"), AccessFlag.LOCAL_READ_WRITE),
            (devs[1], bytearray(8), AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_WRITE),
        ):
            m = Mmap()
            m.set_permissions(perms)
            m.set_memrange(mem)
            m.add_dev(dev)
            m.start()
            mmaps.append(m)
        remote = Mmap.create_from_export(mmaps[1].export_rdma(devs[1]), devs[0])
        mmaps.append(remote)
        src = inv.get_by_data(mmaps[0], mmaps[0].addr, 8)
        dst = inv.get_by_addr(remote, remote.addr, 8)
        samples: list[float] = []
        if api == "job":
            wq = wqs[0]
            job = RdmaWriteJob(ctx=a, src_buf=src, dst_buf=dst)
            for _ in range(count + 20):
                dst.set_data(dst.addr, 0)
                t0 = time.perf_counter()
                wq.submit(job)
                while (ev := wq.progress_retrieve()) is None:
                    pass
                samples.append(time.perf_counter() - t0)
                if not ev.ok:
                    raise RuntimeError(f"the WRITE failed: {ev.error}")
        else:
            task = a.task_write_allocate_init(src, dst)
            for _ in range(count + 20):
                dst.set_data(dst.addr, 0)
                t0 = time.perf_counter()
                task.submit()
                while not done:
                    pe.progress()
                samples.append(time.perf_counter() - t0)
                done.clear()
                if task.error is not None:
                    raise RuntimeError(f"the WRITE failed: {task.error}")
            task.free()
        return float(statistics.median(samples[20:]))
    finally:
        for rdma in ctxs:
            rdma.close()
        for wq in wqs:
            wq.close()
        for m in reversed(mmaps):
            with contextlib.suppress(DocaError):  # best effort: buffers may still hold it
                m.destroy()
        for dev in devs:
            dev.close_all()  # teardown: what the buffers still hold goes too
        pe.close_all()  # teardown on every exit
