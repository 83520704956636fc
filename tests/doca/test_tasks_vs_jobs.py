"""The job API and the task API move the same data with the same results (one core under both).

Each scenario is one of the data-moving flows of ``test_rdma.py`` (RDMA guide
ch. 6 samples, ``doca_rdma.h`` tasks), written once over neutral operations
and run through DOCA 2.0's ``doca_workq``/jobs and DOCA 2.5+'s
``doca_pe``/tasks, over soft RoCEv2 on UDP and soft TCP. Their outcomes
(status, receive opcode/length/immediate, read length), the memory on both
sides and the buffers' data lengths must be identical.
"""

import struct
from collections.abc import Callable
from typing import Any

import pytest

from rdmakit.doca import AccessFlag, DocaErrorCode, RdmaOpcode
from tests.doca.task_harness import ALL_RDMA, RW, Api, Duo, Outcome, op

Scenario = Callable[[Duo], Any]
OK = DocaErrorCode.SUCCESS


def sc_read(d: Duo) -> Any:
    """Guide ch. 6 rdma_read: read the responder's exported bytes."""
    mb, _ = d.b.mmap(b"Hi from the responder\0" + bytes(10), RW | AccessFlag.RDMA_READ)
    remote = d.share(mb)
    ma, mem_a = d.a.mmap(64)
    dst = d.a.room(ma, 0, 64)
    outs = d.run(op("read", "a", src_buf=d.a.data(remote, 0, 22), dst_buf=dst))
    assert outs == [Outcome(OK, length=22)]
    return outs, bytes(mem_a), dst.data_len


def sc_write(d: Duo) -> Any:
    """Guide ch. 6 rdma_write: write into the responder's RDMA_WRITE mmap."""
    mb, mem_b = d.b.mmap(256, RW | AccessFlag.RDMA_WRITE)
    remote = d.share(mb)
    ma, _ = d.a.mmap(b"Hi from the requester\0")
    dst = d.a.room(remote, 0, 256)
    outs = d.run(op("write", "a", src_buf=d.a.data(ma, 0, 22), dst_buf=dst))
    assert bytes(mem_b[:22]) == b"Hi from the requester\0"
    return outs, bytes(mem_b), dst.data_len


def sc_write_immediate(d: Duo) -> Any:
    """Guide ch. 6 rdma_write_immediate: a bufferless receive gets RECV_WRITE_WITH_IMM."""
    mb, mem_b = d.b.mmap(256, RW | AccessFlag.RDMA_WRITE)
    remote = d.share(mb)
    ma, _ = d.a.mmap(b"written with an immediate")
    outs = d.run(
        op("recv", "b", dst_buf=None),
        op(
            "write_imm",
            "a",
            src_buf=d.a.data(ma, 0, 25),
            dst_buf=d.a.room(remote, 0, 256),
            immediate=0xABCD,
        ),
    )
    assert outs[0] == Outcome(OK, RdmaOpcode.RECV_WRITE_WITH_IMM, 25, 0xABCD)
    return outs, bytes(mem_b)


def sc_send_receive(d: Duo) -> Any:
    """Guide ch. 6 rdma_send / rdma_receive, plain and with an immediate."""
    mb, mem_b = d.b.mmap(64)
    dst = d.b.room(mb, 0, 32)
    dst2 = d.b.room(mb, 32, 32)
    ma, _ = d.a.mmap(b"Hi from sender")
    outs = d.run(
        op("recv", "b", dst_buf=dst),
        op("recv", "b", dst_buf=dst2),
        op("send", "a", src_buf=d.a.data(ma, 0, 14)),
        op("send_imm", "a", src_buf=d.a.data(ma, 0, 2), immediate=0x1234),
    )
    assert outs[0] == Outcome(OK, RdmaOpcode.RECV_SEND, 14, None)
    assert outs[1] == Outcome(OK, RdmaOpcode.RECV_SEND_WITH_IMM, 2, 0x1234)
    return outs, bytes(mem_b), dst.data_len, dst2.data_len


def sc_atomics(d: Duo) -> Any:
    """RDMA guide §5 atomics: compare-and-swap then fetch-and-add; old values land in result_buf."""
    mb, mem_b = d.b.mmap(struct.pack("=Q", 5) + bytes(8), RW | AccessFlag.RDMA_ATOMIC)
    remote = d.share(mb)
    ma, mem_a = d.a.mmap(16)
    word = d.a.data(remote, 0, 8)
    outs = d.run(op("cas", "a", dst_buf=word, result_buf=d.a.room(ma, 0, 8), cmp=5, swap=40))
    outs += d.run(op("faa", "a", dst_buf=word, result_buf=d.a.room(ma, 8, 8), add=2))
    assert struct.unpack("=Q", mem_b[:8]) == (42,)
    assert struct.unpack("=QQ", mem_a) == (5, 40)
    return outs, bytes(mem_a), bytes(mem_b)


def sc_writes_append_and_chains(d: Duo) -> Any:
    """Buffer rules: writes append to the remote destination; a chain gathers; a read scatters."""
    mb, mem_b = d.b.mmap(64, RW | AccessFlag.RDMA_WRITE | AccessFlag.RDMA_READ)
    remote = d.share(mb)
    ma, mem_a = d.a.mmap(b"abcdefgh" + bytes(24))
    dst = d.a.room(remote, 0, 64)
    head = d.a.data(ma, 0, 3)
    head.chain_list(d.a.data(ma, 3, 5))
    outs = d.run(op("write", "a", src_buf=d.a.data(ma, 0, 2), dst_buf=dst))
    outs += d.run(op("write", "a", src_buf=head, dst_buf=dst))
    r1, r2 = d.a.room(ma, 8, 4), d.a.room(ma, 12, 20)
    r1.chain_list(r2)
    outs += d.run(op("read", "a", src_buf=d.a.data(remote, 0, 10), dst_buf=r1))
    assert bytes(mem_b[:10]) == b"ababcdefgh"
    return outs, bytes(mem_a), bytes(mem_b), dst.data_len, r1.data_len, r2.data_len


def sc_refused_write(d: Duo) -> Any:
    """RDMA guide §5.1.4: a responder mmap without RDMA_WRITE refuses; the job/task fails alike."""
    mb, mem_b = d.b.mmap(32, RW | AccessFlag.RDMA_READ)
    remote = d.share(mb)
    ma, _ = d.a.mmap(b"nope")
    outs = d.run(op("write", "a", src_buf=d.a.data(ma, 0, 4), dst_buf=d.a.room(remote, 0, 32)))
    assert outs[0].status is not OK
    return outs, bytes(mem_b)


SCENARIOS = [
    pytest.param(sc_read, id="read"),
    pytest.param(sc_write, id="write"),
    pytest.param(sc_write_immediate, id="write-imm"),
    pytest.param(sc_send_receive, id="send-recv"),
    pytest.param(sc_atomics, id="atomics"),
    pytest.param(sc_writes_append_and_chains, id="chains"),
    pytest.param(sc_refused_write, id="refused"),
]


def run_scenario(api: Api, transport: str, new_ip: Callable[[], str], scenario: Scenario) -> Any:
    duo = Duo(api, transport, new_ip, perms_b=ALL_RDMA)
    try:
        return scenario(duo.up())
    finally:
        duo.close()


@pytest.mark.parametrize("transport", ["udp", "tcp"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_both_apis_give_identical_results(
    scenario: Scenario, transport: str, new_ip: Callable[[], str]
) -> None:
    """doca_rdma.h tasks vs. the DOCA 2.0 RDMA jobs: one scenario, two APIs, identical results."""
    by_jobs = run_scenario("job", transport, new_ip, scenario)
    by_tasks = run_scenario("task", transport, new_ip, scenario)
    assert by_tasks == by_jobs
