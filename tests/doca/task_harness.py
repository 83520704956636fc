"""Two RDMA contexts on two soft devices, driven through either DOCA API.

`Duo` builds what the DOCA RDMA samples build (a device, an `Rdma` context,
a buffer inventory and memory maps per side) on one progress engine, then
runs neutral operations (`Op`) through the job API (``WorkQ`` and jobs, DOCA
2.0-2.2) or the task API (``PE`` and tasks, DOCA 2.5+). `Outcome` is what
both APIs report alike, so a scenario's outcomes and memory can be compared
across the two. Waiting is on the engine's notification handle
(``doca_pe.h``: request, wait, clear, progress); a run that stops making
progress fails the test.
"""

import select
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from rdmakit.doca import (
    PE,
    AccessFlag,
    Buf,
    BufInventory,
    CtxState,
    Dev,
    DocaErrorCode,
    Event,
    Job,
    Mmap,
    Rdma,
    RdmaAtomicCmpSwpJob,
    RdmaAtomicFetchAddJob,
    RdmaOpcode,
    RdmaReadJob,
    RdmaRecvJob,
    RdmaResult,
    RdmaSendImmJob,
    RdmaSendJob,
    RdmaTaskRead,
    RdmaTaskReceive,
    RdmaWriteImmJob,
    RdmaWriteJob,
    Task,
    WorkQ,
)
from tests.doca.util import started_mmap

Api = Literal["job", "task"]
RW = AccessFlag.LOCAL_READ_WRITE
ALL_RDMA = RW | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
STALL_LIMIT = 20.0

_JOBS: dict[str, type[Job]] = {
    "recv": RdmaRecvJob,
    "send": RdmaSendJob,
    "send_imm": RdmaSendImmJob,
    "read": RdmaReadJob,
    "write": RdmaWriteJob,
    "write_imm": RdmaWriteImmJob,
    "cas": RdmaAtomicCmpSwpJob,
    "faa": RdmaAtomicFetchAddJob,
}
_TASKS = {
    "recv": "receive",
    "send": "send",
    "send_imm": "send_imm",
    "read": "read",
    "write": "write",
    "write_imm": "write_imm",
    "cas": "atomic_cmp_swp",
    "faa": "atomic_fetch_add",
}
_TASK_ARGS = {"immediate": "immediate_data", "cmp": "cmp_data", "swap": "swap_data", "add": "add_data"}


@dataclass(frozen=True)
class Op:
    """One operation: its kind (a key of `_JOBS`), the side that runs it and the job's fields."""

    kind: str
    side: str
    args: dict[str, Any]


def op(kind: str, side: str, **args: Any) -> Op:
    return Op(kind, side, args)


@dataclass(frozen=True)
class Outcome:
    """What both APIs report: the status, and a receive's opcode, length and immediate, a read's length."""

    status: DocaErrorCode
    opcode: RdmaOpcode | None = None
    length: int | None = None
    immediate: int | None = None


@dataclass
class Side:
    name: str
    dev: Dev
    rdma: Rdma
    inv: BufInventory
    wq: WorkQ | None = None
    memory: list[Mmap] = field(default_factory=list)

    def mmap(self, size_or_bytes: int | bytes, perms: int = RW) -> tuple[Mmap, bytearray]:
        m, mem = started_mmap(self.dev, size_or_bytes, perms)
        self.memory.append(m)
        return m, mem

    def data(self, m: Mmap, offset: int, length: int) -> Buf:
        return self.inv.get_by_data(m, m.addr + offset, length)

    def room(self, m: Mmap, offset: int, length: int) -> Buf:
        return self.inv.get_by_addr(m, m.addr + offset, length)


class Duo:
    """Requester `a` and responder `b` on one `PE`, run through `api`."""

    def __init__(
        self,
        api: Api,
        transport: str,
        new_ip: Callable[[], str],
        *,
        perms_a: int = RW,
        perms_b: int = ALL_RDMA,
        num_tasks: int = 32,
    ) -> None:
        self.api = api
        self.pe = PE()
        self.done: list[Task] = []  # tasks whose callback ran, in order
        self.in_callback: list[bool] = []
        self._progressing = False
        self.sides: list[Side] = []
        for name, perms in (("a", perms_a), ("b", perms_b)):
            # "udp"/"tcp": a soft device of its own; "verbs:NAME": both sides on one verbs device
            verbs = transport.startswith("verbs:")
            spec = transport.removeprefix("verbs:") if verbs else f"{transport}:{new_ip()}"
            dev = Dev.open(spec, pe=self.pe)
            rdma = Rdma()
            rdma.add_dev(dev)
            rdma.set_permissions(perms)
            inv = BufInventory(64)
            inv.start()
            side = Side(name, dev, rdma, inv)
            if api == "job":
                side.wq = WorkQ(num_tasks, pe=self.pe)
                rdma.workq_add(side.wq)
            else:
                self.pe.connect_ctx(rdma)
                for kind in _TASKS.values():
                    getattr(rdma, f"task_{kind}_set_conf")(self._on_task, self._on_task, num_tasks)
            self.sides.append(side)
        self.a, self.b = self.sides

    def _on_task(self, task: Task, task_user_data: object, ctx_user_data: object) -> None:
        self.in_callback.append(self._progressing)
        self.done.append(task)

    def side(self, name: str) -> Side:
        return self.a if name == "a" else self.b

    def up(self) -> "Duo":
        for s in self.sides:
            s.rdma.start()
        da, db = self.a.rdma.export(), self.b.rdma.export()
        self.a.rdma.connect(db)
        self.b.rdma.connect(da)
        if self.api == "task":
            # doca_rdma.h, doca_rdma_connect: "Once called, doca_pe_progress() should be called, in
            # order to transition the ctx to DOCA_CTX_STATE_RUNNING state."
            self._until(
                lambda: all(s.rdma.state is CtxState.RUNNING for s in self.sides),
                lambda: "both contexts RUNNING",
            )
        return self

    def share(self, m: Mmap, *, to: str = "a") -> Mmap:
        owner = self.b if to == "a" else self.a
        return Mmap.create_from_export(m.export_rdma(owner.dev), self.side(to).dev)

    def progress(self) -> bool:
        self._progressing = True
        try:
            return self.pe.progress()
        finally:
            self._progressing = False

    def wait(self) -> None:
        """Sleep on the engine's notification handle (``doca_pe_request_notification``)."""
        self.pe.request_notification()
        select.select([self.pe.fileno()], [], [], 0.5)
        self.pe.clear_notification()

    # -- running operations -------------------------------------------------------------------

    def run(self, *ops: Op) -> list[Outcome]:
        """Submit `ops` in order, wait for all; their outcomes in the same order."""
        return self._run_jobs(ops) if self.api == "job" else self._run_tasks(ops)

    def _until(self, finished: Callable[[], bool], what: Callable[[], str]) -> None:
        last = time.monotonic()
        while not finished():
            if self.progress():
                last = time.monotonic()
                continue
            if finished():
                break
            if time.monotonic() - last > STALL_LIMIT:
                pytest.fail(f"no progress for {STALL_LIMIT}s; still waiting for {what()}")
            self.wait()

    def _run_jobs(self, ops: tuple[Op, ...]) -> list[Outcome]:
        jobs = []
        for o in ops:
            s = self.side(o.side)
            job = _JOBS[o.kind](ctx=s.rdma, **o.args)
            assert s.wq is not None
            s.wq.submit(job)
            jobs.append((s, job))
        events: dict[int, Event] = {}

        def drain() -> bool:
            for s in self.sides:
                assert s.wq is not None
                while (ev := s.wq.progress_retrieve()) is not None:
                    events[id(ev.job)] = ev
            return all(id(j) in events for _, j in jobs)

        self._until(drain, lambda: str([type(j).__name__ for _, j in jobs if id(j) not in events]))
        return [_job_outcome(o.kind, events[id(j)]) for o, (_, j) in zip(ops, jobs, strict=True)]

    def _run_tasks(self, ops: tuple[Op, ...]) -> list[Outcome]:
        tasks: list[Task] = []
        for o in ops:
            rdma = self.side(o.side).rdma
            args = {_TASK_ARGS.get(k, k): v for k, v in o.args.items()}
            task = getattr(rdma, f"task_{_TASKS[o.kind]}_allocate_init")(**args)
            task.submit()
            tasks.append(task)
        self._until(
            lambda: all(any(t is d for d in self.done) for t in tasks),
            lambda: str([t for t in tasks if not any(t is d for d in self.done)]),
        )
        outcomes = [_task_outcome(t) for t in tasks]
        self.done = [d for d in self.done if not any(t is d for t in tasks)]
        for t in tasks:
            t.free()
        return outcomes

    def close(self) -> None:
        for s in self.sides:
            s.rdma.close()
            if s.wq is not None:
                s.wq.close()
            s.dev.close_all()  # teardown: the mmaps a test made go with the device
        self.pe.close()


def _job_outcome(kind: str, ev: Event) -> Outcome:
    if not ev.ok:
        assert ev.error is not None
        return Outcome(ev.error.code)
    res = ev.result
    assert isinstance(res, RdmaResult)
    if kind == "recv":
        return Outcome(DocaErrorCode.SUCCESS, res.opcode, res.length, res.immediate)
    if kind == "read":
        return Outcome(DocaErrorCode.SUCCESS, length=res.length)
    return Outcome(DocaErrorCode.SUCCESS)


def _task_outcome(t: Task) -> Outcome:
    status = t.get_status()
    if status is not DocaErrorCode.SUCCESS:
        return Outcome(status)
    if isinstance(t, RdmaTaskReceive):
        return Outcome(status, t.get_result_opcode(), t.get_result_len(), t.get_result_immediate_data())
    if isinstance(t, RdmaTaskRead):
        return Outcome(status, length=t.get_result_len())
    return Outcome(status)
