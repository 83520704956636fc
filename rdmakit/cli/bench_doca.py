"""The DOCA rows of ``rdmakit bench``: the engine's 8-byte WRITE round trip, through the job and task APIs.

Like for like with the engine's row (``rtt_write_poll``): the same far side
(the child's RDMA responder, `rdmakit.cli.bench_peer.Responder`), the same
8 bytes, one operation at a time, the same warm-up, the same posting and the
same spin policy; only this side differs. Per round trip:

- the engine (`rdmakit.cli.bench_peer.Requester.round_trips`): a new
  ``SendWR``; ``post_send``, whose WRITE leaves in that call, natively
  (``SoftDevice.post_with``); ``Driver.run_until``: a pump pass, then
  ``epoll_wait(0)`` on the driver's descriptor and a look at the CQ per turn
  until the ACK is readable, for ``spin`` seconds after the last pass that did
  work, then a blocking wait; the pass that reads the ACK completes the WQE;
  ``poll(1)``.
- the job API: the destination's data emptied (the WRITE appends there);
  ``doca_workq_submit`` of the same `RdmaWriteJob`, whose kept plan is posted
  to the same engine ``post_send``, leaving the same way (a DOCA soft device
  posts natively); then ``doca_workq_progress_retrieve`` per turn: the
  progress engine runs the device's pump (a pass when the submit rang its
  bell or its descriptor is readable; else one ``poll(0)`` of it), then the
  context takes the completion from its queue pair's ring into the job's
  event. The same spin, then ``doca_pe_request_notification`` and a
  blocking wait on the engine's handle.
- the task API: the same through ``doca_task_submit`` of one `RdmaTaskWrite`
  and ``doca_pe_progress`` per turn, until the task's callback ran.

What still differs: a polling turn of DOCA is a whole ``doca_pe_progress``
(its Python layers around the ``poll(0)``) where the engine's is an
``epoll_wait(0)``; and a DOCA soft device serves QP1 (the connection manager
answers from the start, as a NIC's does), whose checks each pump pass makes.
A WRITE's responder does no DOCA work on any NIC, so the ratio of these rows
to the engine's is what the DOCA layer costs per job.

`alternated` measures the engine's row and both DOCA rows in turn, run by
run, so that the ratio compares runs made under the same load of the host:
on a shared machine the load moves between rows measured one after the
other by more than the 15 % the target allows.

The far side's queue pair and memory come as the engine's endpoint and
registration; they become the DOCA objects a peer's ``doca_rdma_export`` and
``doca_mmap_export_rdma`` would have given (`ConnectionDescriptor`,
`MmapDescriptor`), whose fields are exactly those.
"""

import statistics
import time
from collections.abc import Callable, Mapping
from ipaddress import IPv6Address

from rdmakit.cli.bench_measure import WARM_PINGS
from rdmakit.cli.bench_peer import Child
from rdmakit.cli.errors import CliError
from rdmakit.doca import PE, AccessFlag, Event, MmapDescriptor, RdmaTaskWrite, RdmaWriteJob, WorkQ
from rdmakit.doca.rtt import Api, peer_descriptor, write_loop
from rdmakit.transport.driver import wait_readable

#: Seconds without a completion before the run fails, as the engine's row.
TIMEOUT = 10.0
#: What the far side's registration grants (`rdmakit.cli.bench_peer.EVERY`), as an mmap would.
FAR_ACCESS = (
    AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_ATOMIC
)


#: What a turn of a round trip's loop (`_wait`'s `step`) found: nothing, work done, or the completion.
IDLE, BUSY, DONE = 0, 1, 2


def _wait(pe: PE, step: Callable[[], int], spin: float, what: str) -> None:
    """Run `step` until it returns DONE: `spin` seconds of polling after the last turn that did
    work (BUSY), then block on the engine's notification handle (``doca_pe_request_notification``),
    as the engine's requester does with its driver (``Driver.run_until``)."""
    clock = time.perf_counter
    idle_since: float | None = None
    deadline = clock() + TIMEOUT
    while True:
        got = step()
        if got == DONE:
            return
        now = clock()
        if got:
            idle_since, deadline = None, now + TIMEOUT
            continue
        if idle_since is None:
            idle_since = now
        if now - idle_since < spin:
            continue
        if now > deadline:
            raise CliError(f"{what}: no completion within {TIMEOUT:g} s")
        pe.request_notification()
        if step() == DONE:
            pe.clear_notification()
            return
        wait_readable(pe.fileno(), min(0.05, deadline - now))
        pe.clear_notification()


def write_round_trip(api: Api, child: Child, ip_a: str, ip_b: str, count: int, spin: float) -> float:
    """Median seconds of `count` 8-byte WRITE round trips through `api` (after the warm-up)."""
    child.send(op="rdma", transport="roce-udp", ip=ip_b, size=8, spin=spin, n=1)
    far = child.recv()
    peer = far["endpoints"][0]
    far_mem = MmapDescriptor(
        addr=far["addr"], length=8, rkey=far["rkey"], access=FAR_ACCESS, device=f"udp:{ip_b}",
        gid=IPv6Address(peer["gid"]), mtu=peer["mtu"],
    )  # fmt: skip
    serving = False

    def exchange(mine: Mapping[str, object]) -> None:
        nonlocal serving
        child.send(endpoints=[mine])
        serving = True
        child.recv()  # the far side connected its queue pair

    try:
        with write_loop(api, ip_a, peer_descriptor(peer), far_mem, exchange) as loop:
            if loop.wq is not None and loop.job is not None:
                samples = _job_round_trips(loop.pe, loop.wq, loop.job, count, spin)
            else:
                assert loop.task is not None
                samples = _task_round_trips(loop.pe, loop.task, loop.done, count, spin)
        return float(statistics.median(samples[WARM_PINGS:]))
    finally:
        if serving:
            child.send(op="stop")
            child.recv()  # the far side's counters: it stopped serving


def alternated(
    engine: Callable[[], float], child: Child, ip_a: str, ip_b: str, count: int, spin: float, runs: int
) -> tuple[list[float], list[float], list[float]]:
    """`runs` medians each (seconds) of the engine's round trip (`engine`), the job API's and the task
    API's, measured in turn: each round runs all three, starting one further along than the last."""
    fns: tuple[Callable[[], float], ...] = (
        engine,
        lambda: write_round_trip("job", child, ip_a, ip_b, count, spin),
        lambda: write_round_trip("task", child, ip_a, ip_b, count, spin),
    )
    out: tuple[list[float], list[float], list[float]] = ([], [], [])
    for i in range(runs):
        for k in range(len(fns)):
            j = (i + k) % len(fns)
            out[j].append(fns[j]())
    return out


def _job_round_trips(pe: PE, wq: WorkQ, job: RdmaWriteJob, count: int, spin: float) -> list[float]:
    dst = job.dst_buf
    got: list[Event] = []

    def step() -> int:
        ev = wq.progress_retrieve()  # doca_workq_progress_retrieve: it progresses the engine
        if ev is None:
            return IDLE  # (the job API does not say whether the engine did any work)
        got.append(ev)
        return DONE

    out: list[float] = []
    for _ in range(WARM_PINGS + count):
        dst.set_data(dst.addr, 0)  # the WRITE appends at the data's end: the same 8 bytes each time
        t0 = time.perf_counter()
        wq.submit(job)
        _wait(pe, step, spin, "DOCA job API WRITE")
        out.append(time.perf_counter() - t0)
        ev = got.pop()
        if not ev.ok:
            raise CliError(f"the DOCA WRITE job failed: {ev.error}")
    return out


def _task_round_trips(
    pe: PE, task: RdmaTaskWrite, done: list[RdmaTaskWrite | None], count: int, spin: float
) -> list[float]:
    dst = task.get_dst_buf()

    def step() -> int:
        busy = pe.progress()  # doca_pe_progress: the task's callback runs in here
        return DONE if done[0] is not None else BUSY if busy else IDLE

    out: list[float] = []
    for _ in range(WARM_PINGS + count):
        dst.set_data(dst.addr, 0)
        t0 = time.perf_counter()
        task.submit()
        _wait(pe, step, spin, "DOCA task API WRITE")
        out.append(time.perf_counter() - t0)
        done[0] = None
        if task.error is not None:
            raise CliError(f"the DOCA WRITE task failed: {task.error}")
    return out
