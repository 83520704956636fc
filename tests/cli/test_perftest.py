"""``rdmakit perftest`` and ``rdmakit rc-pingpong`` between two rdmakit processes on loopback.

Each test runs a server and a client, each on its own soft device, with the
tools' out-of-band exchange on a TCP port of its own, and parses what both
print with a parser written from perftest's and rc_pingpong's formats
(``perftest_parameters.h`` ``RESULT_FMT``/``REPORT_FMT``, ``RESULT_FMT_LAT``/
``REPORT_FMT_LAT``; ``rc_pingpong.c``'s two result lines).
"""

import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.cli.cli_util import wait_listening
from tests.cli.perftest_output import PP_ADDR, PP_BYTES, PP_ITERS, parse_perftest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def rdmakit(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rdmakit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def finish(p: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=240)
    return p.returncode, out, err


def run_pair(
    new_ip: Callable[[], str], command: list[str], flags: list[str]
) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    port = str(free_port())
    server_ip, client_ip = new_ip(), new_ip()
    server = rdmakit(*command, "-d", server_ip, "-p", port, *flags)
    wait_listening(int(port), server)
    client = rdmakit(*command, "-d", client_ip, "-p", port, *flags, "127.0.0.1")
    c = finish(client)
    s = finish(server)
    return s, c


TESTS = [f"ib_{verb}_{kind}" for kind in ("bw", "lat") for verb in ("write", "read", "send", "atomic")]
#: Default sizes with few iterations, and a multi-packet message (MTU 1024, 5 packets).
CASES = [(t, ["-n", "20"]) for t in TESTS] + [
    (t, ["-n", "20", "-s", "5000", "-m", "1024"]) for t in TESTS if "atomic" not in t
]


def expected_size(test: str, flags: list[str]) -> int:
    if "atomic" in test:
        return 8
    if "-s" in flags:
        return int(flags[flags.index("-s") + 1])
    return 65536 if test.endswith("_bw") else 2


@pytest.mark.parametrize(("test", "flags"), CASES, ids=[f"{t}{''.join(f)}" for t, f in CASES])
def test_perftest_pair(new_ip: Callable[[], str], test: str, flags: list[str]) -> None:
    (s_rc, s_out, s_err), (c_rc, c_out, c_err) = run_pair(new_ip, ["perftest", test], flags)
    assert c_rc == 0, c_err
    assert s_rc == 0, s_err
    kind, c_rows = parse_perftest(c_out)
    assert kind == ("bw" if test.endswith("_bw") else "lat")
    iters = int(flags[flags.index("-n") + 1])
    assert [(r.size, r.iters) for r in c_rows] == [(expected_size(test, flags), iters)]
    # Everything moved: a rate or a latency above zero.
    assert all(v >= 0 for v in c_rows[0].values)
    assert c_rows[0].values[1 if kind == "bw" else 0] > 0
    s_kind, s_rows = parse_perftest(s_out)
    if test in ("ib_read_lat", "ib_atomic_lat"):
        assert s_rows == []  # only the client measures reads and atomics
    else:
        assert s_kind == kind
        assert [(r.size, r.iters) for r in s_rows] == [(r.size, r.iters) for r in c_rows]
    # Both sides printed the other's QP as its remote address.
    local = re.findall(r" local address: LID \S+ QPN (0x[0-9a-f]+)", c_out)
    remote = re.findall(r" remote address: LID \S+ QPN (0x[0-9a-f]+)", s_out)
    assert local == remote


@pytest.mark.parametrize(
    ("test", "flags", "rows"),
    [
        ("ib_write_bw", ["-n", "8", "-q", "2"], [(65536, 16)]),
        ("ib_send_bw", ["-n", "8", "-q", "2"], [(65536, 16)]),
        ("ib_write_bw", ["-n", "8", "-b"], [(65536, 8)]),
        ("ib_read_bw", ["-n", "8", "-b"], [(65536, 8)]),
        ("ib_send_bw", ["-n", "8", "-b"], [(65536, 8)]),
        ("ib_atomic_bw", ["-n", "8", "-b", "-A", "CMP_AND_SWAP"], [(8, 8)]),
        ("ib_write_bw", ["-n", "5", "-a"], [(1 << i, 5) for i in range(1, 24)]),
        ("ib_send_lat", ["-n", "5", "-a"], [(1 << i, 5) for i in range(1, 24)]),
        ("ib_read_bw", ["-n", "10", "--report_gbits", "-t", "4", "-Q", "2"], [(65536, 10)]),
        ("ib_write_bw", ["-n", "8", "-u", "18"], [(65536, 8)]),
    ],
    ids=["write-q2", "send-q2", "write-b", "read-b", "send-b", "cas-b", "write-a", "slat-a", "gbits", "u18"],
)
def test_perftest_options(
    new_ip: Callable[[], str], test: str, flags: list[str], rows: list[tuple[int, int]]
) -> None:
    (s_rc, s_out, s_err), (c_rc, c_out, c_err) = run_pair(new_ip, ["perftest", test], flags)
    assert c_rc == 0, c_err
    assert s_rc == 0, s_err
    _, c_rows = parse_perftest(c_out)
    _, s_rows = parse_perftest(s_out)
    assert [(r.size, r.iters) for r in c_rows] == rows
    if test == "ib_write_bw" and "-a" in flags:
        assert [(r.size, r.iters) for r in s_rows] == rows[-1:]  # the server prints the last report only
    else:
        assert [(r.size, r.iters) for r in s_rows] == rows
    if "--report_gbits" in flags:
        assert "BW average[Gb/sec]" in c_out


@pytest.mark.parametrize("test", ["ib_write_bw", "ib_send_bw", "ib_write_lat", "ib_read_lat"])
def test_perftest_duration(new_ip: Callable[[], str], test: str) -> None:
    """-D: the run ends with the clock; the iterations completed are counted and reported."""
    (s_rc, s_out, s_err), (c_rc, c_out, c_err) = run_pair(new_ip, ["perftest", test], ["-D", "1"])
    assert c_rc == 0, c_err
    assert s_rc == 0, s_err
    kind, c_rows = parse_perftest(c_out)
    assert kind == ("bw" if test.endswith("_bw") else "lat_dur")
    assert len(c_rows) == 1
    assert c_rows[0].iters > 0
    _, s_rows = parse_perftest(s_out)
    if test == "ib_write_bw":  # the server prints the client's report
        assert s_rows == c_rows
    elif test == "ib_read_lat":
        assert s_rows == []
    else:  # each side counts its own completions
        assert len(s_rows) == 1
        assert s_rows[0].iters > 0


def test_rc_pingpong_pair(new_ip: Callable[[], str]) -> None:
    for flags in (["-n", "50"], ["-n", "20", "-s", "20000", "-m", "2048", "-r", "3"]):
        (s_rc, s_out, s_err), (c_rc, c_out, c_err) = run_pair(new_ip, ["rc-pingpong"], flags)
        assert c_rc == 0, c_err
        assert s_rc == 0, s_err
        iters = int(flags[1])
        size = int(flags[flags.index("-s") + 1]) if "-s" in flags else 4096
        for out in (s_out, c_out):
            lines = out.splitlines()
            addrs = [PP_ADDR.match(line) for line in lines[:2]]
            assert all(addrs), out
            b = PP_BYTES.match(lines[2])
            i = PP_ITERS.match(lines[3])
            assert b, out
            assert i, out
            assert int(b.group(1)) == size * iters * 2
            assert int(i.group(1)) == iters
        # Each side's remote address is the other's local one.
        s_remote = s_out.splitlines()[1].split("address:")[1].strip()
        assert s_remote == c_out.splitlines()[0].split("address:")[1].strip()


@pytest.mark.parametrize("command", [["perftest", "ib_write_bw"], ["rc-pingpong"]])
def test_tcp_device_is_refused(new_ip: Callable[[], str], command: list[str]) -> None:
    rc, _, err = finish(rdmakit(*command, "-d", f"tcp:{new_ip()}", "-p", str(free_port())))
    assert rc != 0
    assert len(err.strip().splitlines()) == 1
    assert "connection secret" in err


def test_perftest_flag_errors() -> None:
    rc, _, err = finish(rdmakit("perftest", "ib_atomic_bw", "-s", "16", "-d", "127.0.0.1"))
    assert rc != 0
    assert err.strip() == "rdmakit perftest: Message size cannot be changed for Atomic tests"
    rc, _, err = finish(rdmakit("perftest", "ib_write_bw", "-u", "32", "-d", "127.0.0.1"))
    assert rc != 0
    assert err.strip() == "rdmakit perftest: QP timeout must be 0..31, not 32"
    rc, out, _ = finish(rdmakit("perftest", "ib_write_bw", "-V"))
    assert rc == 0
    assert out.strip() == "Version: 6.06"
