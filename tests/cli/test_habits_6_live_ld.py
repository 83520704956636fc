"""A second program given a live run's ``-ld`` path does not take it over: it stops, naming the pid.

The first run holds its status file's lock while it lives; the second used
to replace the descriptor silently, and the first then ended with "the peer
exited" when the second's requester connected to the wrong responder.
"""

from collections.abc import Callable
from pathlib import Path

from tests.cli.cli_util import finish, paths, side, spawn, wait_until

RESPONDER = ["rdma-write-responder"]


def test_a_live_owners_ld_file_is_not_replaced(new_ip: Callable[[], str], tmp_path: Path) -> None:
    p = paths(tmp_path)
    first = spawn(*side(RESPONDER, new_ip(), p["resp"], p["req"], p["mmap"], timeout="60"))
    try:
        wait_until(lambda: Path(p["resp"]).exists(), what="the first responder's descriptor")
        before = Path(p["resp"]).read_bytes()
        rc, _, err = finish(spawn(*side(RESPONDER, new_ip(), p["resp"], p["req"], str(tmp_path / "m2"))), 60)
        assert rc == 2
        assert len(err.splitlines()) == 1, err
        assert f"is the descriptor of a run still going (pid {first.pid}," in err
        assert Path(p["resp"]).read_bytes() == before
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.communicate()
