"""The DOCA RDMA sample pairs with ``--api task`` (DOCA 2.9 samples, ``samples/doca_rdma``).

The same subcommands and output as the job-API samples; the sides may mix
APIs, since the wire does not know which one a peer uses.
"""

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.sample_pairs import pair

IPS = Callable[[], str]
TASK = ["--api", "task"]

PAIRS = [
    pytest.param(
        ["rdma-write-requester", "-w", "written by a task"],
        ["rdma-write-responder"],
        "Written to the responder: written by a task",
        "Remote write: written by a task",
        id="write",
    ),
    pytest.param(
        ["rdma-read-requester"],
        ["rdma-read-responder", "-r", "read me, task"],
        "Read from the responder: read me, task",
        "The requester read 13 bytes: read me, task",
        id="read",
    ),
    pytest.param(
        ["rdma-send", "-s", "sent by a task"],
        ["rdma-receive"],
        "Sent: sent by a task",
        "Received: sent by a task",
        id="send-receive",
    ),
    pytest.param(
        ["rdma-send-immediate", "--immediate", "7"],
        ["rdma-receive-immediate"],
        "Sent with immediate 0x00000007: Hi DOCA RDMA!",
        "Received with immediate 0x00000007: Hi DOCA RDMA!",
        id="send-receive-imm",
    ),
    pytest.param(
        ["rdma-write-immediate-requester", "--immediate", "0xC0FFEE"],
        ["rdma-write-immediate-responder"],
        "Written to the responder with immediate 0x00c0ffee: Hi DOCA RDMA!",
        "Remote write with immediate 0x00c0ffee: Hi DOCA RDMA!",
        id="write-imm",
    ),
    pytest.param(
        ["rdma-atomic-requester", "--op", "faa", "--add", "5"],
        ["rdma-atomic-responder", "--initial", "10"],
        "Fetch-and-add: original value 10, added 5",
        "Atomic faa: value was 10, is now 15",
        id="atomic",
    ),
]


@pytest.mark.parametrize("transport", ["udp", "tcp"])
@pytest.mark.parametrize(("requester", "responder", "req_out", "resp_out"), PAIRS)
def test_task_api_pairs(
    requester: list[str],
    responder: list[str],
    req_out: str,
    resp_out: str,
    transport: str,
    tmp_path: Path,
    new_ip: IPS,
) -> None:
    """DOCA 2.9 rdma_*_sample.c: PE, set_conf, allocate_init, submit, progress; the job samples' output."""
    r, s = pair(tmp_path, (new_ip(), new_ip()), transport, requester + TASK, responder + TASK)
    assert r == (0, req_out, "")
    assert s == (0, resp_out, "")


def test_the_apis_mix(tmp_path: Path, new_ip: IPS) -> None:
    """A task-API requester and a job-API responder interoperate (RDMA guide ch. 6 pairs)."""
    r, s = pair(
        tmp_path,
        (new_ip(), new_ip()),
        "udp",
        ["rdma-write-requester", "-w", "mixed", *TASK],
        ["rdma-write-responder"],
    )
    assert r == (0, "Written to the responder: mixed", "")
    assert s == (0, "Remote write: mixed", "")
