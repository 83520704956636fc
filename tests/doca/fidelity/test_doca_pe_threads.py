"""``doca_pe.h`` and ``doca_dev.h``: one device, a progress engine per thread.

DOCA's usual design opens a device once and gives each thread its own PE and
its own contexts on that device. Two threads here each make a PE and a pair
of RDMA contexts on the same two devices (opened once, under a third engine
nobody progresses), connect them and move checked bytes at the same time: the
devices' pumps are run by both engines, and each context's callbacks run in
its own thread, inside its own engine's progress.
"""

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rdmakit.doca import PE, Buf, BufInventory, CtxState, Dev, DocaErrorCode, Mmap, Rdma, Task
from rdmakit.doca.rdma_tasks import RdmaTaskReceive
from tests.doca.task_harness import ALL_RDMA
from tests.doca.util import started_mmap

MESSAGES = 40
SIZE = 512
STALL = 60.0  # seconds without any progress before a thread gives up (never asserted as a time)


@dataclass
class Worker:
    """One thread's engine and contexts, and what its callbacks saw."""

    devs: tuple[Dev, Dev]
    seed: int
    done: list[Task] = field(default_factory=list)
    seen: list[tuple[int, bool]] = field(default_factory=list)  # (thread id, inside this PE's progress)
    error: BaseException | None = None
    checked: int = 0

    def run(self, start: threading.Barrier) -> None:
        try:
            self._run(start)
        except BaseException as e:  # reported by the main thread
            self.error = e

    def _cb(self, task: Task, task_ud: object, ctx_ud: object) -> None:
        self.seen.append((threading.get_ident(), self.pe.in_progress))
        self.done.append(task)

    def _until(self, finished: Callable[[], bool]) -> None:
        last = time.monotonic()
        while not finished():
            if self.pe.progress():
                last = time.monotonic()
            elif time.monotonic() - last > STALL:
                raise AssertionError(f"no progress for {STALL} s")

    def _run(self, start: threading.Barrier) -> None:
        self.pe = pe = PE()
        a, b = Rdma(self.devs[0]), Rdma(self.devs[1])
        inv = BufInventory(4 * MESSAGES)
        inv.start()
        for r in (a, b):
            r.set_permissions(ALL_RDMA)
            r.set_send_queue_size(2 * MESSAGES)  # every write and send in flight at once
            r.set_recv_queue_size(MESSAGES)
            r.task_write_set_conf(self._cb, self._cb, MESSAGES)
            r.task_send_set_conf(self._cb, self._cb, MESSAGES)
            r.task_receive_set_conf(self._cb, self._cb, MESSAGES)
            pe.connect_ctx(r)
            r.start()
        a.connect(b.export())
        b.connect(a.export())
        self._until(lambda: a.state is CtxState.RUNNING and b.state is CtxState.RUNNING)
        data = os.urandom(SIZE * MESSAGES) if self.seed else bytes(range(256)) * (SIZE * MESSAGES // 256)
        src, _ = started_mmap(self.devs[0], data, ALL_RDMA)
        dst, dst_mem = started_mmap(self.devs[1], SIZE * MESSAGES, ALL_RDMA)
        box, box_mem = started_mmap(self.devs[1], SIZE * MESSAGES, ALL_RDMA)
        remote = Mmap.create_from_export(dst.export_rdma(self.devs[1]), self.devs[0])
        start.wait()
        tasks: list[Task] = []
        bufs: list[Buf] = []

        def buf(m: Mmap, i: int, *, full: bool) -> Buf:
            got = (inv.get_by_data if full else inv.get_by_addr)(m, m.addr + i * SIZE, SIZE)
            bufs.append(got)
            return got

        recvs = [b.task_receive_allocate_init(buf(box, i, full=False)) for i in range(MESSAGES)]
        for recv in recvs:
            recv.submit()
        tasks += recvs
        for i in range(MESSAGES):
            write = a.task_write_allocate_init(buf(src, i, full=True), buf(remote, i, full=False))
            send = a.task_send_allocate_init(buf(src, i, full=True))
            write.submit()
            send.submit()
            tasks += [write, send]
            self.pe.progress()
        self._until(lambda: len(self.done) == len(tasks))
        for t in tasks:
            assert t.get_status() is DocaErrorCode.SUCCESS, t
        assert bytes(dst_mem) == data, "every write landed"
        assert bytes(box_mem) == data, "every send landed, in order"
        assert all(isinstance(r, RdmaTaskReceive) and r.get_result_rdma_connection() is b for r in recvs)
        self.checked = len(data)
        for t in tasks:
            t.free()
        for got in bufs:
            got.dec_refcount()
        for r in (a, b):
            r.stop()
        self._until(lambda: a.state is CtxState.IDLE and b.state is CtxState.IDLE)
        for r in (a, b):
            r.close()
        remote.destroy()
        for m in (src, dst, box):
            m.destroy()
        inv.destroy()
        pe.close()


def test_two_engines_on_two_threads_share_one_device(transport: str, new_ip: Callable[[], str]) -> None:
    """doca_pe.h, doca_pe_connect_ctx connects a context to "a progress engine"; doca_dev_open opens a
    device once for all of them: contexts of one device on two PEs, each PE progressed by its own
    thread at the same time, each task's callback in its own thread inside its own doca_pe_progress."""
    verbs = transport.startswith("verbs:")
    specs = [transport.removeprefix("verbs:")] * 2 if verbs else [f"{transport}:{new_ip()}" for _ in range(2)]
    with PE() as idle:  # opens the devices; never progressed: the workers' engines pump them
        devs = (Dev.open(specs[0], pe=idle), Dev.open(specs[1], pe=idle))
        try:
            workers = [Worker(devs, seed) for seed in (0, 1)]
            start = threading.Barrier(2)
            threads = [threading.Thread(target=w.run, args=(start,)) for w in workers]
            for t in threads:
                t.start()
            for t in threads:
                t.join(600)
            for w in workers:
                if w.error is not None:
                    raise w.error
            for w, t in zip(workers, threads, strict=True):
                assert w.checked == SIZE * MESSAGES
                assert {tid for tid, _ in w.seen} == {t.ident}, "callbacks ran in the context's own thread"
                assert all(inside for _, inside in w.seen), "callbacks ran inside its own PE's progress"
                assert len(w.seen) == 3 * MESSAGES
        finally:
            for dev in devs:
                dev.close()
