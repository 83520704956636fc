"""The DOCA RDMA samples with DOCA 2.9's ``-cm``: connected by address, memory descriptors still by file."""

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.cli_util import finish, run_once, spawn


@pytest.mark.parametrize("api", ["job", "task"])
@pytest.mark.parametrize("client_first", [False, True])
def test_write_pair_connects_by_address(
    tmp_path: Path, new_ip: Callable[[], str], api: str, client_first: bool
) -> None:
    """The responder listens on its -d address; the requester connects with -sa, in either order."""
    server, client = new_ip(), new_ip()
    resp_file, req_file, mmap_file = (str(tmp_path / n) for n in ("resp.json", "req.json", "mmap.json"))
    common = ["-cm", "--port", "7477", "--api", api, "--timeout", "30", "-m", mmap_file]
    responder = ["rdma-write-responder", "-d", server, "-ld", resp_file, "-re", req_file, *common]
    requester = ["rdma-write-requester", "-d", client, "-sa", server, "-sat", "ipv4", "-ld", req_file,
                 "-re", resp_file, "-w", "by address", *common]  # fmt: skip
    first, second = (requester, responder) if client_first else (responder, requester)
    p1 = spawn(*first)
    p2 = spawn(*second)
    results = {first[0]: finish(p1), second[0]: finish(p2)}
    req_rc, req_out, req_err = results["rdma-write-requester"]
    resp_rc, resp_out, resp_err = results["rdma-write-responder"]
    assert (req_rc, resp_rc) == (0, 0), (req_err, resp_err)
    assert req_out == "Written to the responder: by address"
    assert resp_out == "Remote write: by address"
    assert sorted(tmp_path.iterdir()) == []  # what each side published is gone


def test_cm_flags_are_checked() -> None:
    rc, _, err = run_once("rdma-send", "-d", "127.0.0.1", "-sa", "127.0.0.2")
    assert rc == 2
    assert err == "rdmakit rdma-send: -sa/--server-addr goes with -cm/--use-rdma-cm"
    rc, _, err = run_once("rdma-send", "-d", "127.0.0.1", "-cm", "-sa", "nowhere")
    assert rc == 2
    assert "not an IP address" in err
