"""A program's life through the real CLI: signals, stale files, peers that fail, early refusals."""

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.cli_util import alive, children, finish, paths, run_once, side, spawn, wait_until

IPS = Callable[[], str]
WRITE_REQ = ["rdma-write-requester", "-w", "fresh"]
WRITE_RESP = ["rdma-write-responder"]


def write_pair(tmp: Path, new_ip: IPS, requester_first: bool = False) -> None:
    """A write pair on the usual paths in ``tmp``; both succeed and leave nothing behind."""
    f = paths(tmp)
    req_args = side(WRITE_REQ, new_ip(), f["req"], f["resp"], f["mmap"])
    resp_args = side(WRITE_RESP, new_ip(), f["resp"], f["req"], f["mmap"])
    first, second = (req_args, resp_args) if requester_first else (resp_args, req_args)
    a = spawn(*first)
    b = spawn(*second)
    ra, rb = finish(a), finish(b)
    req, resp = (ra, rb) if requester_first else (rb, ra)
    assert req == (0, "Written to the responder: fresh", ""), req
    assert resp == (0, "Remote write: fresh", ""), resp
    assert sorted(tmp.iterdir()) == []


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_mid_wait_removes_the_files_then_a_fresh_pair_works(
    signo: signal.Signals, tmp_path: Path, new_ip: IPS
) -> None:
    f = paths(tmp_path)
    req = spawn(*side(WRITE_REQ, new_ip(), f["req"], f["resp"], f["mmap"]))
    wait_until(lambda: Path(f["req"]).exists(), what="the requester publishes its descriptor")
    req.send_signal(signo)
    rc, _out, err = finish(req)
    assert rc == 128 + signo
    assert err == f"rdmakit: stopped by {signo.name}"
    assert sorted(tmp_path.iterdir()) == []
    write_pair(tmp_path, new_ip)


def test_a_killed_run_leaves_stale_files_that_are_named_and_skipped(tmp_path: Path, new_ip: IPS) -> None:
    f = paths(tmp_path)
    resp = spawn(*side(WRITE_RESP, new_ip(), f["resp"], f["req"], f["mmap"]))
    wait_until(lambda: Path(f["resp"]).exists(), what="the responder publishes its descriptor")
    resp.kill()  # SIGKILL: nothing can clean up
    finish(resp)
    assert Path(f["resp"]).exists()
    assert Path(f["mmap"]).exists()
    # Alone, a requester does not take the dead run's files: it waits, and its timeout names them.
    rc, _out, err = run_once(*side(WRITE_REQ, new_ip(), f["req"], f["resp"], f["mmap"], timeout="1"))
    assert rc == 3, err
    assert len(err.splitlines()) == 1
    assert f"waiting for the peer's connection descriptor ({f['resp']})" in err
    assert "stale" in err
    assert f"pid {resp.pid}" in err
    # A fresh pair on the same paths works, whichever side starts first.
    write_pair(tmp_path, new_ip, requester_first=True)


def crossed_receivers(
    tmp: Path, new_ip: IPS, pre: str = ""
) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Two receivers connected to each other: each waits for a message that never comes."""
    a, b = str(tmp / "a.json"), str(tmp / "b.json")
    pa = spawn("rdma-receive", "-d", pre + new_ip(), "-ld", a, "-re", b, "--timeout", "120", "-l", "50")
    pb = spawn("rdma-receive", "-d", pre + new_ip(), "-ld", b, "-re", a, "--timeout", "120", "-l", "50")
    for p in (pa, pb):
        assert p.stderr is not None
        for _ in range(20):
            line = p.stderr.readline()
            if not line or line.rstrip().endswith("connected"):
                break
        assert line.rstrip().endswith("connected"), line
    return pa, pb


@pytest.mark.parametrize("pre", ["", "tcp:"])
def test_a_peer_killed_after_connecting_is_reported_at_once(pre: str, tmp_path: Path, new_ip: IPS) -> None:
    pa, pb = crossed_receivers(tmp_path, new_ip, pre)
    pa.kill()
    finish(pa)
    rc, _out, err = finish(pb)
    assert rc == 1  # not 3: it did not wait out its 120 s
    assert f"rdmakit rdma-receive: the peer died without a word (pid {pa.pid}" in err
    assert "Traceback" not in err


def test_a_peer_stopped_after_connecting_passes_on_its_reason(tmp_path: Path, new_ip: IPS) -> None:
    pa, pb = crossed_receivers(tmp_path, new_ip)
    pa.send_signal(signal.SIGTERM)
    assert finish(pa)[0] == 143
    rc, _out, err = finish(pb)
    assert rc == 1
    assert f"the peer failed (pid {pa.pid}" in err
    assert err.endswith("stopped by SIGTERM")
    assert sorted(tmp_path.iterdir()) == []


def test_a_failure_after_connecting_reaches_the_responder(tmp_path: Path, new_ip: IPS) -> None:
    """The requester's write is refused (read-only memory): the responder exits with that reason."""
    f = paths(tmp_path)
    resp = spawn(*side(["rdma-read-responder"], new_ip(), f["resp"], f["req"], f["mmap"], timeout="120"))
    req = spawn(*side(["rdma-write-requester"], new_ip(), f["req"], f["resp"], f["mmap"], timeout="120"))
    r, s = finish(req), finish(resp)
    assert r[0] == 1
    assert "the RDMA write failed" in r[2]
    assert s[0] == 1
    assert "the peer failed" in s[2]
    assert "the RDMA write failed" in s[2]
    assert len(s[2].splitlines()) == 1


def test_a_udp_responder_and_a_tcp_requester_both_stop_at_once(tmp_path: Path, new_ip: IPS) -> None:
    f = paths(tmp_path)
    resp = spawn(*side(WRITE_RESP, new_ip(), f["resp"], f["req"], f["mmap"], timeout="120"))
    req = spawn(*side(WRITE_REQ, "tcp:" + new_ip(), f["req"], f["resp"], f["mmap"], timeout="120"))
    r, s = finish(req), finish(resp)
    for rc, _out, err in (r, s):
        assert rc == 1, err  # neither waits out its 120 s (status 3)
        assert len(err.splitlines()) == 1
        assert "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["rdma-atomic-requester", "--add", "-1"], "--add"),
        (["rdma-atomic-requester", "--op", "cas", "--swap", str(1 << 64)], "--swap"),
        (["rdma-atomic-responder", "--initial", "-5"], "--initial"),
        (["rdma-atomic-responder", "--initial", str(1 << 64)], "--initial"),
        (["rdma-write-immediate-requester", "--immediate", "0x100000000"], "--immediate"),
        (["rdma-send", "--timeout", "-1"], "--timeout"),
        (["rdma-send", "--timeout", "nan"], "--timeout"),
        (["rdma-receive", "-g", "-3"], "--gid-index"),
    ],
)
def test_bad_numbers_are_refused_before_anything_is_published(
    args: list[str], names: str, tmp_path: Path, new_ip: IPS
) -> None:
    f = paths(tmp_path)
    rc, _out, err = run_once(*side(args, new_ip(), f["req"], f["resp"], f["mmap"]))
    assert rc == 2
    assert names in err
    assert "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == []


def test_a_local_descriptor_in_a_missing_directory_is_named(tmp_path: Path, new_ip: IPS) -> None:
    where = tmp_path / "nowhere" / "req.json"
    rc, _out, err = run_once("rdma-send", "-d", new_ip(), "-ld", str(where), "-re", str(tmp_path / "r"))
    assert rc == 2
    assert err == (f"rdmakit rdma-send: -ld {where}: the directory {where.parent} does not exist")


def test_interactive_with_no_input_is_one_line(tmp_path: Path, new_ip: IPS) -> None:
    f = paths(tmp_path)
    p = spawn(*side(["rdma-receive", "--interactive"], new_ip(), f["req"], f["resp"], f["mmap"]),
              stdin=subprocess.DEVNULL)  # fmt: skip
    rc, _out, err = finish(p)
    assert rc == 1
    assert err == "rdmakit rdma-receive: --interactive needs a terminal: standard input is closed"
    assert sorted(tmp_path.iterdir()) == []


def test_a_closed_stdout_is_not_an_error() -> None:
    """``rdmakit devices | head -0``: the reader went away; no BrokenPipe message, status 0."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "rdmakit", "devices", "--verbose"],
            stdout=w, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(w)
    assert p.stderr == ""
    assert p.returncode == 0


def test_version_names_the_data_plane() -> None:
    rc, out, _err = run_once("--version")
    assert rc == 0
    assert "UDP data plane: " in out
    rc, out, _err = run_once("devices", "--verbose")
    assert "UDP data plane: " in out


def test_sigterm_to_bench_takes_its_far_side_along(new_ip: IPS) -> None:
    p = spawn("bench", "--runs", "1000", "--total", "64", "--ip-a", new_ip(), "--ip-b", new_ip())
    assert p.stdout is not None
    assert p.stdout.readline().startswith("rdmakit bench:")
    wait_until(lambda: bool(children(p.pid)), what="bench starts its far side")
    far = children(p.pid)
    p.send_signal(signal.SIGTERM)
    rc, _out, err = finish(p)
    assert rc == 143
    assert err.endswith("rdmakit: stopped by SIGTERM")
    wait_until(lambda: not any(alive(c) for c in far), 30, "the far side exits")


@pytest.mark.skipif(os.geteuid() != 0, reason="a live capture needs root")
def test_ctrl_c_on_a_live_capture_prints_the_summary() -> None:
    p = spawn("capture", "-i", "lo", "-q", "-l", "50")
    assert p.stderr is not None
    line = p.stderr.readline()
    assert "capturing on lo" in line, line
    p.send_signal(signal.SIGINT)
    rc, _out, err = finish(p)
    assert rc == 130
    assert "RoCEv2 packets," in err
    assert err.endswith("rdmakit: interrupted")
