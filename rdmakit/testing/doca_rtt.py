"""One 8-byte WRITE round trip through the engine, the DOCA job API and the DOCA task API, stage by stage.

The far side is a plain soft device in the caller's thread, pumped by hand
(`Far`), so nothing is left to a scheduler: each side (`engine_side`,
`doca_side`) yields one callable per stage of `STAGES`, and `_run` calls each
until it returns True; the DOCA side is `rdmakit.doca.rtt.write_loop`, as in
``rdmakit bench``. `measure` gives the median time and the median count of
Python calls of each stage (`Calls`, through ``sys.setprofile``); ``only``
counts the calls of one package's code, e.g. the DOCA layer's own.
``benchmarks/bench_doca_stages.py`` prints them; tests hold the DOCA layer's
calls per stage to a bound.

A soft device on a loopback address delivers a datagram to its peer's socket
before ``sendto`` returns, so every stage but the idle one does its work in one
call of its callable.
"""

import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from ipaddress import IPv6Address
from types import FrameType, ModuleType

from rdmakit.doca import AccessFlag, MmapDescriptor
from rdmakit.doca.rtt import Api, peer_descriptor, write_loop
from rdmakit.engine import SGE, Access, CompletionQueue, SendWR, WcStatus, WrOpcode
from rdmakit.transport.connect import Endpoint, connect_qp, local_endpoint
from rdmakit.transport.device import SoftDevice
from rdmakit.transport.driver import Driver

__all__ = ["STAGES", "Allocations", "Calls", "Far", "Steps", "doca_side", "engine_side", "measure"]

STAGES = ("submit", "requester: one pass", "far side: receive, place, ACK", "complete", "idle progress")


def _once(progress: Callable[[], object]) -> Callable[[], bool]:
    """The requester's stage after the submit: one pass of its pump. A soft device posts natively,
    so its request left in the submit; otherwise this pass sends it."""

    def step() -> bool:
        progress()
        return True

    return step


@dataclass(frozen=True)
class Steps:
    """One round trip: a callable per stage of `STAGES`, each run until it returns True, and what
    readies the next round trip (not a stage: neither timed nor counted)."""

    stages: tuple[Callable[[], bool], ...]
    reset: Callable[[], None] = lambda: None


class Far:
    """The far side: a soft device with 8 writable bytes and one QP, pumped by hand."""

    def __init__(self, ip: str) -> None:
        self.dev = SoftDevice(ip)
        self.cq = CompletionQueue(64)
        self.mem = bytearray(8)
        every = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ
        self.mr = self.dev.pd.register(self.mem, 0x4000_0000, every)
        self.qp = self.dev.create_qp(send_cq=self.cq, recv_cq=self.cq)
        self.psn = random.getrandbits(24)
        self.ep = local_endpoint(self.dev, self.qp, self.psn)

    def step(self) -> bool:
        return self.dev.progress(time.perf_counter())

    def close(self) -> None:
        self.dev.close()


@contextmanager
def engine_side(far: Far, ip: str) -> Iterator[Steps]:
    dev = SoftDevice(ip)
    driver = Driver()
    driver.add(dev)
    dev.post_with(driver.clock)  # as ``rdmakit bench``'s engine row (`Requester`) and a DOCA soft device
    cq = CompletionQueue(64)
    qp = dev.create_qp(send_cq=cq, recv_cq=cq)
    psn = random.getrandbits(24)
    connect_qp(dev, qp, psn, far.ep)
    connect_qp(far.dev, far.qp, far.psn, local_endpoint(dev, qp, psn))
    mem = bytearray(b"8 bytes!")
    mr = dev.pd.register(mem, 0x1000, Access.LOCAL_WRITE)
    wr = SendWR(
        wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=(SGE(0x1000, 8, mr.lkey),), remote_addr=far.mr.addr,
        rkey=far.mr.rkey,
    )  # fmt: skip

    def submit() -> bool:
        qp.post_send(wr)
        return True

    def complete() -> bool:
        driver.progress()
        if not len(cq):
            return False
        if cq.poll(1)[0].status is not WcStatus.SUCCESS:
            raise SystemExit("the engine's WRITE failed")
        return True

    try:
        yield Steps((submit, _once(driver.progress), far.step, complete, lambda: not driver.progress()))
    finally:
        driver.close()
        dev.close()


@contextmanager
def doca_side(far: Far, ip: str, api: str) -> Iterator[Steps]:
    """The DOCA side through the job API (`api` "job") or the task API (any other)."""
    ep = far.ep
    mem = MmapDescriptor(
        addr=far.mr.addr, length=8, rkey=far.mr.rkey, access=AccessFlag.RDMA_WRITE, device=f"udp:{ep.ip}",
        gid=IPv6Address(ep.gid), mtu=ep.mtu,
    )  # fmt: skip

    def exchange(mine: Mapping[str, object]) -> None:
        connect_qp(far.dev, far.qp, far.psn, Endpoint(**mine))  # type: ignore[arg-type]

    which: Api = "job" if api == "job" else "task"
    with write_loop(which, ip, peer_descriptor(asdict(ep)), mem, exchange) as loop:
        pe, done = loop.pe, loop.done
        if loop.wq is not None and loop.job is not None:
            queue, job = loop.wq, loop.job

            def submit() -> bool:
                queue.submit(job)
                return True

            def complete() -> bool:
                ev = queue.progress_retrieve()
                if ev is None:
                    return False
                if ev.error is not None:
                    raise SystemExit(f"the DOCA WRITE job failed: {ev.error}")
                return True

            yield Steps(
                (submit, _once(pe.progress), far.step, complete, lambda: queue.progress_retrieve() is None),
                loop.reset,
            )
        else:
            task = loop.task
            assert task is not None

            def submit() -> bool:
                task.submit()
                return True

            def complete() -> bool:
                pe.progress()
                if done[0] is None:
                    return False
                done[0] = None
                if task.error is not None:
                    raise SystemExit(f"the DOCA WRITE task failed: {task.error}")
                return True

            yield Steps(
                (submit, _once(pe.progress), far.step, complete, lambda: not pe.progress()), loop.reset
            )


def _run(steps: Steps, out: list[list[int]], clock: Callable[[], int]) -> None:
    for k, step in enumerate(steps.stages):
        t0 = clock()
        while not step():
            pass
        out[k].append(clock() - t0)
    steps.reset()


class Calls:
    """Python function calls (``sys.setprofile``'s "call" events), counted while active: all of them,
    or those of code whose file is under `only` (a folder such as ``rdmakit/doca/``)."""

    def __init__(self, only: str | None = None) -> None:
        self.n = 0
        self.only = only

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and (self.only is None or self.only in frame.f_code.co_filename):
            self.n += 1

    def clock(self) -> int:
        """The calls so far, as a "clock" for `_run` (its own call is not counted)."""
        sys.setprofile(None)
        n = self.n
        sys.setprofile(self)
        return n


def measure(
    steps: Steps, count: int, calls: int, warm: int = 300, only: str | None = None
) -> tuple[list[float], list[float]]:
    """Median µs of each stage over `count` round trips, and its median Python calls (`Calls`) over
    `calls` more."""
    times: list[list[int]] = [[] for _ in STAGES]
    for _ in range(warm):
        _run(steps, [[] for _ in STAGES], time.perf_counter_ns)
    for _ in range(count):
        _run(steps, times, time.perf_counter_ns)
    counted: list[list[int]] = [[] for _ in STAGES]
    counter = Calls(only)
    for _ in range(calls):
        sys.setprofile(counter)
        try:
            _run(steps, counted, counter.clock)
        finally:
            sys.setprofile(None)
    us = [statistics.median(t) / 1e3 if t else 0.0 for t in times]
    # A stage's count includes the stage's own callables and the counter's one call per clock.
    return us, [float(statistics.median(c)) if c else 0.0 for c in counted]


class Allocations:
    """Memory blocks allocated while code whose file is under `only` runs, through ``sys.setprofile``.

    Between two profiler events one frame runs: the rise of ``sys.getallocatedblocks()`` since the
    last event is that frame's (neither the frame object of a Python call nor the bound method of
    a C method's call, each made for the profiler, is counted). What a frame allocates and frees
    again before the next event, or takes from a free list, does not show; what it keeps past the
    next event (an event, a result, an entry in a table, a loop's iterator, a bound method held by
    a ``with``) does.
    """

    def __init__(self, only: str) -> None:
        self.only = only
        self.blocks = 0
        self.sites: dict[tuple[str, int], int] = {}
        self._frames: list[FrameType] = []
        self._last = sys.getallocatedblocks()

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        rise = sys.getallocatedblocks() - self._last
        if event == "call":
            rise -= 1  # the callee's frame object, made for this hook
        elif event == "c_call" and not isinstance(getattr(arg, "__self__", None), ModuleType):
            rise -= 1  # the bound method the profiler makes to report a method descriptor's call
        frames = self._frames
        if rise > 0 and frames and self.only in (code := frames[-1].f_code).co_filename:
            self.blocks += rise
            site = (f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}", frames[-1].f_lineno)
            self.sites[site] = self.sites.get(site, 0) + rise
        if event == "call":
            frames.append(frame)
        elif event == "return" and frames:
            frames.pop()
        self._last = sys.getallocatedblocks()

    def run(self, steps: Steps, count: int) -> float:
        """Blocks per round trip over `count` round trips of `steps`, each stage run from the top."""
        before = self.blocks
        for _ in range(count):
            for step in steps.stages:
                self._frames.clear()
                self._last = sys.getallocatedblocks()
                sys.setprofile(self)
                try:
                    while not step():
                        pass
                finally:
                    sys.setprofile(None)
            steps.reset()
        return (self.blocks - before) / count
