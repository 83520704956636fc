"""A two-sided RDMA test harness: two soft devices, two contexts.

`Pair` builds what each DOCA RDMA sample builds (RDMA guide ch. 6,
``rdma_common.c`` ``allocate_rdma_resources``): per side a device, an `Rdma`
context with its own `WorkQ`, a buffer inventory and memory maps. `Pair.run`
submits jobs and drives both work queues until every job's event is back,
polling or waiting on the event handles (``select`` or epoll). A wait that
never wakes fails the test: an event-driven wakeup that is lost is a bug, not
a slow run.

`PAIR_CONFIGS` are both soft transports (RoCEv2 on UDP, framed on TCP) times
both WorkQ modes (polling, event-driven); the ``pair_cfg`` and ``make_pair``
fixtures of ``tests/doca/conftest.py`` run a test over each.
"""

import select
import selectors
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from rdmakit.doca import (
    AccessFlag,
    Buf,
    BufInventory,
    Dev,
    Event,
    Job,
    Mmap,
    Rdma,
    RdmaResult,
    RdmaState,
    WorkQ,
    read_descriptor,
    write_descriptor,
)

TransportName = Literal["udp", "tcp"]
Mode = Literal["poll", "event"]
Waiter = Literal["select", "epoll"]

ALL_RDMA = AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
#: Longest a test waits without any progress before calling the run hung.
STALL_LIMIT = 20.0


@dataclass
class Side:
    name: str
    dev: Dev
    rdma: Rdma
    wq: WorkQ
    inv: BufInventory
    memory: list[tuple[Mmap, bytearray]] = field(default_factory=list)

    def mmap(
        self, size_or_bytes: int | bytes, perms: int = AccessFlag.LOCAL_READ_WRITE
    ) -> tuple[Mmap, bytearray]:
        """A started local mmap over fresh memory, registered on this side's device."""
        mem = bytearray(size_or_bytes)
        m = Mmap()
        m.set_permissions(perms)
        m.set_memrange(mem)
        m.add_dev(self.dev)
        m.start()
        self.memory.append((m, mem))
        return m, mem

    def data(self, m: Mmap, offset: int, length: int) -> Buf:
        """A source buffer: ``length`` bytes of data at ``offset``."""
        return self.inv.get_by_data(m, m.addr + offset, length)

    def room(self, m: Mmap, offset: int, length: int) -> Buf:
        """An empty destination buffer of ``length`` bytes at ``offset``."""
        return self.inv.get_by_addr(m, m.addr + offset, length)

    def import_mmap(self, descriptor: bytes) -> Mmap:
        """The peer's exported mmap, as this side's remote mmap."""
        return Mmap.create_from_export(descriptor, self.dev)


class Pair:
    """Requester `a` and responder `b`, on two loopback addresses."""

    def __init__(
        self,
        transport: TransportName,
        mode: Mode,
        new_ip: Callable[[], str],
        *,
        perms_a: int = AccessFlag.LOCAL_READ_WRITE,
        perms_b: int = ALL_RDMA,
        waiter: Waiter = "epoll",
        depth: int = 32,
        configure: Callable[[Rdma], None] | None = None,
    ) -> None:
        self.transport = transport
        self.mode = mode
        self.waiter = waiter
        self.sides: list[Side] = []
        self.unclaimed: dict[int, Event] = {}
        for name, perms in (("a", perms_a), ("b", perms_b)):
            spec = f"{transport}:{new_ip()}"
            dev = Dev.open(spec)
            rdma = Rdma()
            rdma.add_dev(dev)
            rdma.set_permissions(perms)
            if configure is not None:
                configure(rdma)
            wq = WorkQ(depth, event_driven=mode == "event")
            rdma.workq_add(wq)
            inv = BufInventory(64)
            inv.start()
            self.sides.append(Side(name, dev, rdma, wq, inv))
        self.a, self.b = self.sides

    # -- connection ---------------------------------------------------------------------

    def start(self) -> None:
        for s in self.sides:
            s.rdma.start()

    def connect(self, via: Literal["bytes", "files"] = "bytes", tmp_path: Path | None = None) -> None:
        """Swap connection descriptors and connect both sides (guide §4 steps 4-6)."""
        da, db = self.a.rdma.export(), self.b.rdma.export()
        if via == "files":
            assert tmp_path is not None
            pa, pb = tmp_path / "a_connection_desc.json", tmp_path / "b_connection_desc.json"
            write_descriptor(pa, da, overwrite=True)
            write_descriptor(pb, db, overwrite=True)
            da, db = read_descriptor(pa), read_descriptor(pb)
        self.a.rdma.connect(db)
        self.b.rdma.connect(da)

    def up(self, via: Literal["bytes", "files"] = "bytes", tmp_path: Path | None = None) -> "Pair":
        self.start()
        self.connect(via, tmp_path)
        assert self.a.rdma.rdma_state is RdmaState.CONNECTED
        assert self.b.rdma.rdma_state is RdmaState.CONNECTED
        return self

    def share(
        self,
        m: Mmap,
        via: Literal["bytes", "files"] = "bytes",
        tmp_path: Path | None = None,
        *,
        to: str = "a",
    ) -> Mmap:
        """Export `m` from its side and import it on side `to` (guide §4, DOCA Core 3.3)."""
        owner = self.b if to == "a" else self.a
        other = self.a if to == "a" else self.b
        desc = m.export_rdma(owner.dev)
        if via == "files":
            assert tmp_path is not None
            path = tmp_path / f"{owner.name}_mmap_desc.json"
            write_descriptor(path, desc, overwrite=True)
            desc = read_descriptor(path)
        return other.import_mmap(desc)

    def recover(self) -> None:
        """The recovery flow: workq_rm, stop, start, workq_add, export, connect on both sides."""
        for s in self.sides:
            s.rdma.workq_rm(s.wq)
            s.rdma.stop()
            assert s.rdma.rdma_state is RdmaState.RESET
        for s in self.sides:
            s.rdma.workq_add(s.wq)
        self.up()

    # -- running jobs ---------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        side = self.a if job.ctx is self.a.rdma else self.b
        side.wq.submit(job)

    def drain(self) -> list[Event]:
        got = []
        for s in self.sides:
            while (ev := s.wq.progress_retrieve()) is not None:
                got.append(ev)
        return got

    def wait(self, timeout: float) -> bool:
        """Event mode: arm both handles and wait; True if one became readable."""
        fds = [s.wq.fileno() for s in self.sides]
        for s in self.sides:
            s.wq.arm()
        if self.waiter == "select":
            ready, _, _ = select.select(fds, [], [], timeout)
        else:
            with selectors.EpollSelector() as sel:
                for fd in fds:
                    sel.register(fd, selectors.EVENT_READ)
                ready = [key.fd for key, _ in sel.select(timeout)]
        for s in self.sides:
            if s.wq.fileno() in ready:
                s.wq.clear()
        return bool(ready)

    def collect(self, jobs: Iterable[Job]) -> dict[int, Event]:
        """Drive both sides until every job in `jobs` has its event; keyed by id(job)."""
        want = {id(j) for j in jobs}
        events = self.unclaimed  # events of other jobs stay here for a later collect
        last = time.monotonic()
        while not want <= events.keys():
            got = self.drain()
            for ev in got:
                events[id(ev.job)] = ev
            if got:
                last = time.monotonic()
                continue
            if time.monotonic() - last > STALL_LIMIT:
                missing = [type(j).__name__ for j in jobs if id(j) not in events]
                pytest.fail(f"no progress for {STALL_LIMIT}s; still waiting for {missing}")
            if self.mode == "event":
                self.wait(min(1.0, STALL_LIMIT))
        return {key: events.pop(key) for key in want}

    def run(self, *jobs: Job) -> list[Event]:
        """Submit `jobs` in order, then wait for all their events; returned in the same order."""
        for job in jobs:
            self.submit(job)
        events = self.collect(jobs)
        return [events[id(j)] for j in jobs]

    def close(self) -> None:
        for s in self.sides:
            s.rdma.close()
            s.wq.close()
            s.dev.close_all()  # teardown: the mmaps a test made go with the device


def result(ev: Event) -> RdmaResult:
    """The `RdmaResult` of a successful RDMA job's event."""
    assert isinstance(ev.result, RdmaResult), ev
    return ev.result


PAIR_CONFIGS = [
    pytest.param(("udp", "poll"), id="udp-poll"),
    pytest.param(("udp", "event"), id="udp-event"),
    pytest.param(("tcp", "poll"), id="tcp-poll"),
    pytest.param(("tcp", "event"), id="tcp-event"),
]

PairFactory = Callable[..., Pair]
