"""rdmakit.doca.aio: awaiting DOCA jobs from trio on event-driven WorkQs (DOCA Core 3.4 event handle).

Waiting is ``trio.lowlevel.wait_readable`` on the WorkQ handle: while a job
is outstanding every task is blocked (no busy loop), which
``trio.testing.wait_all_tasks_blocked`` checks.
"""

from collections.abc import Callable, Iterator
from typing import Literal

import pytest
import trio
import trio.testing

from rdmakit.doca import (
    AccessFlag,
    DocaError,
    DocaErrorCode,
    Event,
    RdmaRecvJob,
    RdmaSendJob,
    RdmaWriteJob,
    SyncEvent,
    SyncEventWaitGtJob,
    WorkQ,
    aio,
)
from tests.doca.rdma_harness import Pair

RW = AccessFlag.LOCAL_READ_WRITE


@pytest.fixture(params=["udp", "tcp"])
def pair(request: pytest.FixtureRequest, new_ip: Callable[[], str]) -> Iterator[Pair]:
    transport: Literal["udp", "tcp"] = request.param
    p = Pair(transport, "event", new_ip)
    try:
        yield p.up()
    finally:
        p.close()


async def test_send_and_receive_from_two_tasks(pair: Pair) -> None:
    """Guide ch. 6 send/receive, each side a task awaiting its own WorkQ."""
    p = pair
    mb, mem_b = p.b.mmap(16)
    ma, _ = p.a.mmap(b"hello, trio")
    got: dict[str, Event] = {}

    async def receiver() -> None:
        got["recv"] = await aio.run_job(p.b.wq, RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 0, 16)))

    async def sender() -> None:
        await trio.testing.wait_all_tasks_blocked()  # the receive is posted and its task asleep
        got["send"] = await aio.run_job(p.a.wq, RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 0, 11)))

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver)
            nursery.start_soon(sender)
    assert got["recv"].ok
    assert got["send"].ok
    assert bytes(mem_b[:11]) == b"hello, trio"


async def test_run_jobs_returns_events_in_job_order(pair: Pair) -> None:
    """Several writes in flight at once; their events come back matched to their jobs."""
    p = pair
    mb, mem_b = p.b.mmap(32, RW | AccessFlag.RDMA_WRITE)
    remote = p.share(mb)
    ma, _ = p.a.mmap(bytes(range(32)))
    jobs = [
        RdmaWriteJob(
            ctx=p.a.rdma, src_buf=p.a.data(ma, 8 * i, 8), dst_buf=p.a.room(remote, 8 * i, 8), user_data=i
        )
        for i in range(4)
    ]
    with trio.fail_after(20):
        events = await aio.run_jobs(p.a.wq, jobs)
    assert [ev.user_data for ev in events] == [0, 1, 2, 3]
    assert all(ev.ok for ev in events)
    assert bytes(mem_b) == bytes(range(32))


async def test_many_tasks_wait_on_one_workq(pair: Pair) -> None:
    """Any number of tasks may wait on one WorkQ; one drives the handle and each gets its own event."""
    p = pair
    mb, mem_b = p.b.mmap(64)
    recvs = [RdmaRecvJob(ctx=p.b.rdma, dst_buf=p.b.room(mb, 8 * i, 8), user_data=i) for i in range(8)]
    results: dict[int, Event] = {}

    async def wait_one(job: RdmaRecvJob) -> None:
        results[int(job.user_data)] = await aio.run_job(p.b.wq, job)  # type: ignore[call-overload]

    ma, _ = p.a.mmap(b"".join(bytes([i]) * 8 for i in range(8)))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for job in recvs:
                nursery.start_soon(wait_one, job)
            await trio.testing.wait_all_tasks_blocked()
            sends = [RdmaSendJob(ctx=p.a.rdma, src_buf=p.a.data(ma, 8 * i, 8)) for i in range(8)]
            assert all(ev.ok for ev in await aio.run_jobs(p.a.wq, sends))
    assert sorted(results) == list(range(8))
    assert all(ev.ok and ev.job is recvs[i] for i, ev in results.items())
    # Tasks post in trio's (random) order; each receive got one whole message.
    chunks = sorted(bytes(mem_b[8 * i : 8 * i + 8]) for i in range(8))
    assert chunks == [bytes([i]) * 8 for i in range(8)]


async def test_waiting_is_not_a_busy_loop(pair: Pair) -> None:
    """The waiting task sleeps in wait_readable: every task is blocked until the peer acts."""
    p = pair
    recv = RdmaRecvJob(ctx=p.b.rdma)
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def waiter() -> None:
            await aio.run_job(p.b.wq, recv)
            done.set()

        nursery.start_soon(waiter)
        with trio.fail_after(10):  # a busy loop never lets all tasks block
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert not done.is_set()
        with trio.fail_after(20):
            await aio.run_job(p.a.wq, RdmaSendJob(ctx=p.a.rdma, src_buf=None))
            await done.wait()


async def test_a_cancelled_wait_loses_nothing(pair: Pair) -> None:
    """A cancelled wait leaves the job in flight; its event can still be awaited, or taken by next_event."""
    p = pair
    recv = RdmaRecvJob(ctx=p.b.rdma)
    p.b.wq.submit(recv)
    with trio.move_on_after(0.05) as scope:
        await aio.wait_job(p.b.wq, recv)
    assert scope.cancelled_caught
    assert p.b.rdma.num_inflight == 1
    with trio.fail_after(20):
        await aio.run_job(p.a.wq, RdmaSendJob(ctx=p.a.rdma, src_buf=None))
        ev = await aio.next_event(p.b.wq)
    assert ev.job is recv
    assert ev.ok


async def test_next_event_skips_jobs_someone_waits_for(pair: Pair) -> None:
    """next_event hands out only events no wait_job claims."""
    p = pair
    claimed, free = (
        RdmaRecvJob(ctx=p.b.rdma, user_data="claimed"),
        RdmaRecvJob(ctx=p.b.rdma, user_data="free"),
    )
    p.b.wq.submit(claimed)
    p.b.wq.submit(free)
    got: dict[str, Event] = {}

    async def claim() -> None:
        got["claimed"] = await aio.wait_job(p.b.wq, claimed)

    async def any_event() -> None:
        got["any"] = await aio.next_event(p.b.wq)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claim)
            nursery.start_soon(any_event)
            await trio.testing.wait_all_tasks_blocked()
            await aio.run_jobs(p.a.wq, [RdmaSendJob(ctx=p.a.rdma), RdmaSendJob(ctx=p.a.rdma)])
    assert got["claimed"].job is claimed
    assert got["any"].job is free


async def test_misuse_raises_at_once(pair: Pair) -> None:
    """Submission errors are raised, as by WorkQ.submit; a polling WorkQ is refused (no busy loop here)."""
    p = pair
    with pytest.raises(DocaError) as exc:
        await aio.run_job(WorkQ(4), RdmaRecvJob(ctx=p.b.rdma))
    assert exc.value.code is DocaErrorCode.BAD_STATE
    p.b.rdma.workq_rm(p.b.wq)
    small = WorkQ(2, event_driven=True)
    p.b.rdma.workq_add(small)
    try:
        jobs = [RdmaRecvJob(ctx=p.b.rdma) for _ in range(3)]
        async with trio.open_nursery() as nursery:
            failure: list[DocaError] = []

            async def submit_three() -> None:
                try:
                    await aio.run_jobs(small, jobs)
                except DocaError as e:
                    failure.append(e)

            nursery.start_soon(submit_three)
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(20):
                await aio.run_jobs(p.a.wq, [RdmaSendJob(ctx=p.a.rdma), RdmaSendJob(ctx=p.a.rdma)])
        # The two submitted jobs completed before the third's NO_MEMORY propagated.
        assert [e.code for e in failure] == [DocaErrorCode.NO_MEMORY]
        assert p.b.rdma.num_inflight == 0
    finally:
        p.b.rdma.workq_rm(small)
        small.close()


async def test_any_context_not_only_rdma() -> None:
    """aio is generic over contexts: a sync-event wait completes when another task updates the event."""
    wq = WorkQ(4, event_driven=True)
    with SyncEvent() as ev:
        ev.workq_add(wq)
        ev.start()

        async def publish() -> None:
            await trio.testing.wait_all_tasks_blocked()
            ev.update_set(5)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish)
            with trio.fail_after(10):
                got = await aio.run_job(wq, SyncEventWaitGtJob(ctx=ev, value=4))
        assert got.ok
        assert got.result == 5
    wq.close()
