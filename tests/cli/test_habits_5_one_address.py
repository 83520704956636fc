"""Two programs on one address: one line naming the process that holds it, the rule and the fix.

A soft device is one process's UDP socket (port 4791 on its address); kernel
rxe is one device all processes share. The second program used to end with
``[Errno 98] Address already in use`` and no hint.
"""

import os
from collections.abc import Callable

import pytest

from rdmakit.transport.in_use import udp_holders
from tests.cli.cli_util import finish, spawn, wait_listening, wait_until
from tests.cli.test_perftest import free_port


@pytest.mark.parametrize(
    "second",
    [
        ["perftest", "ib_write_lat", "-d", "{ip}", "-p", "{port2}"],
        [
            "rdma-write-responder",
            "-d",
            "{ip}",
            "-ld",
            "{tmp}/r.json",
            "-re",
            "{tmp}/q.json",
            "-m",
            "{tmp}/m.json",
        ],
        ["rping", "-s", "-a", "{ip}"],
    ],
    ids=["perftest", "sample", "rping"],
)  # fmt: skip
def test_both_ends_on_one_address(
    new_ip: Callable[[], str], tmp_path: os.PathLike[str], second: list[str]
) -> None:
    ip, port = new_ip(), free_port()
    first = spawn("perftest", "ib_write_lat", "-d", ip, "-p", str(port))
    try:
        wait_listening(port, first)
        wait_until(lambda: udp_holders(ip, 4791) != [], what=f"the first program on {ip}:4791")
        args = [a.format(ip=ip, port2=free_port(), tmp=tmp_path) for a in second]
        rc, _, err = finish(spawn(*args), 120)
    finally:
        first.kill()
        first.communicate()
    assert rc == 1
    assert len(err.splitlines()) == 1, err
    assert f"UDP {ip}:4791 is held by process {first.pid}" in err
    assert "one process's socket" in err
    assert "kernel rxe" in err
    assert "every 127.x.y.z is this machine's" in err
    assert "Errno" not in err
