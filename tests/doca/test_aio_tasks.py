"""rdmakit.doca.aio with tasks: awaiting a task and the engine's progress from trio.

DOCA 2.5+ ``doca_pe.h`` event-driven flow (doca_pe_request_notification,
wait on doca_pe_get_notification_handle, doca_pe_clear_notification); the
callbacks of ``set_conf`` still run inside progress.
"""

from collections.abc import Callable, Iterator

import pytest
import trio
import trio.testing

from rdmakit.doca import AccessFlag, DocaErrorCode, RdmaOpcode, aio
from tests.doca.task_harness import Duo


@pytest.fixture(params=["udp", "tcp"])
def duo(request: pytest.FixtureRequest, new_ip: Callable[[], str]) -> Iterator[Duo]:
    d = Duo("task", request.param, new_ip)
    try:
        yield d.up()
    finally:
        d.close()


def test_await_send_and_receive_tasks(duo: Duo) -> None:
    """doca_pe.h: the completion callback runs inside progress, then the awaiting trio task resumes."""
    ma, _ = duo.a.mmap(b"from trio")
    mb, mem_b = duo.b.mmap(32)

    async def main() -> None:
        recv = duo.b.rdma.task_receive_allocate_init(duo.b.room(mb, 0, 32))
        send = duo.a.rdma.task_send_allocate_init(duo.a.data(ma, 0, 9))
        recv.submit()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(aio.wait_task, recv)
            await trio.testing.wait_all_tasks_blocked()  # asleep on the handle, not spinning
            await aio.run_task(send)
        assert recv.get_status() is DocaErrorCode.SUCCESS
        assert recv.get_result_opcode() is RdmaOpcode.RECV_SEND
        assert send in duo.done
        assert recv in duo.done

    trio.run(main)
    assert bytes(mem_b[:9]) == b"from trio"


def test_await_a_failed_task_and_progress(duo: Duo) -> None:
    """doca_pe.h doca_task_get_status: a failed task is returned with its status, not raised."""
    mb, _ = duo.b.mmap(8, AccessFlag.LOCAL_READ_WRITE | AccessFlag.RDMA_READ)
    ma, _ = duo.a.mmap(b"12345678")

    async def main() -> None:
        remote = duo.share(mb)
        task = duo.a.rdma.task_write_allocate_init(duo.a.data(ma, 0, 8), duo.a.room(remote, 0, 8))
        done = await aio.run_task(task)
        assert done is task
        assert task.get_status() is DocaErrorCode.NOT_PERMITTED

    trio.run(main)


def test_await_progress(duo: Duo) -> None:
    """doca_pe.h doca_pe_progress "1 if progress was made": awaited, it sleeps until there is some."""
    ma, _ = duo.a.mmap(b"x")
    mb, _ = duo.b.mmap(8)

    async def main() -> None:
        duo.b.rdma.task_receive_allocate_init(duo.b.room(mb, 0, 8)).submit()
        duo.a.rdma.task_send_allocate_init(duo.a.data(ma, 0, 1)).submit()
        while len(duo.done) < 2:
            assert await aio.progress(duo.pe) is True

    trio.run(main)
