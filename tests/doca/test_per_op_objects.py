"""Resubmitting DOCA work makes no new task, job, plan or event object per operation.

DOCA takes a task from its context's pool, sized by ``num_tasks``
(``doca_rdma_task_write_set_conf``), and ``doca_task_free`` returns it there;
a DOCA 2.0 job is the caller's own struct, its work-queue entry a slot of the
ring, its event filled in place (``doca_workq_progress_retrieve``). Here the
objects whose ``__init__`` runs during N round trips are counted (never
timed): the first round trips make the pool's tasks, the job, its plan and
its event, the next N make none.
"""

import sys
from collections import Counter
from collections.abc import Callable
from types import FrameType

import pytest

from rdmakit.doca import AccessFlag, Buf, Event, Job, RdmaResult, RdmaTaskWrite, RdmaWriteJob, Task
from rdmakit.doca.rdma_jobs import Posted
from rdmakit.engine.types import SendWR
from tests.doca.task_harness import RW, Api, Duo

#: What DOCA keeps in a pool, in the caller's struct or in a ring slot, and Python makes as objects.
WATCHED = (Task, Job, Posted, SendWR, Event, RdmaResult)
WARM_UP = 3
N = 40


class Births:
    """Objects of `WATCHED` classes whose ``__init__`` ran, each counted once: every one is kept
    alive, so no two share an id, and a pool's task initialised again is not new."""

    def __init__(self) -> None:
        self.seen: dict[int, object] = {}
        self.new: list[object] = []

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_name == "__init__":
            obj = frame.f_locals.get("self")
            if isinstance(obj, WATCHED) and id(obj) not in self.seen:
                self.seen[id(obj)] = obj
                self.new.append(obj)

    def count(self, run: Callable[[], None]) -> Counter[str]:
        """The objects `run` made that this counter has not seen before, by class."""
        self.new.clear()
        sys.setprofile(self._profile)
        try:
            run()
        finally:
            sys.setprofile(None)
        return Counter(type(o).__name__ for o in self.new)


def _write_bufs(duo: Duo) -> tuple[Buf, Buf]:
    ma, _ = duo.a.mmap(b"8 bytes!")
    mb, _ = duo.b.mmap(8, RW | AccessFlag.RDMA_WRITE)
    return duo.a.data(ma, 0, 8), duo.a.room(duo.share(mb), 0, 8)


def _round_trips(duo: Duo, src: Buf, dst: Buf, *, free_each: bool) -> Callable[[int], None]:
    """`n` 8-byte WRITEs one at a time: the same job, the same task, or a task allocated and freed
    around each (the DOCA samples' pattern)."""
    if duo.api == "job":
        wq = duo.a.wq
        assert wq is not None
        job = RdmaWriteJob(ctx=duo.a.rdma, src_buf=src, dst_buf=dst)
        got: list[Event] = []

        def retrieved() -> bool:
            ev = wq.progress_retrieve()  # doca_workq_progress_retrieve
            if ev is not None:
                got.append(ev)
            return bool(got)

        def one() -> None:
            wq.submit(job)
            duo._until(retrieved, lambda: "the event")
            assert got.pop().ok

    else:
        kept: list[RdmaTaskWrite] = []

        def one() -> None:
            task = duo.a.rdma.task_write_allocate_init(src, dst) if free_each or not kept else kept[0]
            kept[:] = [task]
            task.submit()
            duo._until(lambda: task in duo.done, lambda: "the callback")
            duo.done.clear()
            assert task.get_status().name == "SUCCESS", task.error
            if free_each:
                task.free()

    def run(n: int) -> None:
        for _ in range(n):
            dst.set_data(dst.addr, 0)  # the WRITE appends: the same 8 bytes each time
            one()

    return run


@pytest.mark.parametrize(
    ("api", "free_each"),
    [("job", False), ("task", False), ("task", True)],
    ids=["job", "task", "task-alloc-free"],
)
def test_no_object_per_operation(api: Api, free_each: bool, new_ip: Callable[[], str]) -> None:
    duo = Duo(api, "udp", new_ip, num_tasks=2).up()
    try:
        src, dst = _write_bufs(duo)
        run = _round_trips(duo, src, dst, free_each=free_each)
        births = Births()
        first = births.count(lambda: run(WARM_UP))
        # The counter sees what the first round trips make: the job's plan and work request, its
        # success event and result, and on the task API the pool's tasks and their jobs.
        made = {"Posted", "SendWR", "Event", "RdmaResult"}
        if api == "task":
            made |= {"RdmaTaskWrite", "RdmaWriteJob"}
        assert set(first) == made, first
        assert births.count(lambda: run(N)) == Counter(), f"{N} round trips made objects"
    finally:
        duo.close()
